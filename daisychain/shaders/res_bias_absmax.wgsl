// The bias of a linear or conv layer on the resident path (webui/units/gpu_plan.js), added
// to its GEMM accumulator in place, and max |acc| of the result (res_absmax.wgsl's, for the
// requantize that follows) in one pass. A GEMM split over K (webui/units/gpu_split.js) left
// `parts` partials `stride` apart in the accumulator's room: they are summed first (wrapping
// i32 adds: the unsplit sum's bits), acc[i] = sum over z < parts of acc[z * stride + i] (parts
// 0 or 1: acc[i] as it is). Then acc[r * n_out + o] += bias[t * n_out + o], t =
// state[tin] the shifts summed below this layer, i.e. the row of the bias table the host
// computed for every exponent the accumulator can have (layers.js biasAcc: |bias| <= 2^30, and
// the layer's in-features bound keeps the sum in int32; t beyond the table is clamped to its
// last row, and the host checks the shifts it reads back); then, when want_max != 0,
// state[slot] = max(state[slot], |acc|) as u32 (|-2^31| = 2^31 fits).
// Four lanes of an emulated SIMD routine (consecutive lid.x) take four consecutive columns and
// the same rows, so each load is one vector load; an invocation walks ROWS rows of its column
// in order (no division per element), then one atomicMax.
// Dispatch: (ceil(n_out / 4), ceil(rows / (16 * ROWS))) workgroups of 4 x 16.

const ROWS = 16u;

struct Params {
  rows: u32, n_out: u32, tin: u32, table_rows: u32,
  slot: u32, want_max: u32, parts: u32, stride: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> bias: array<i32>;
@group(0) @binding(2) var<storage, read_write> acc: array<i32>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;

@compute @workgroup_size(4, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let o = wid.x * 4u + lid.x;
  let r0 = (wid.y * 16u + lid.y) * ROWS;
  if (o >= params.n_out || r0 >= params.rows) {
    return;
  }
  let n = params.n_out;
  let t = min(atomicLoad(&state[params.tin]), params.table_rows - 1u);
  let bv = bias[t * n + o];
  let r1 = min(params.rows, r0 + ROWS);
  var best = 0u;
  for (var r = r0; r < r1; r++) {
    let i = r * n + o;
    var v = acc[i];
    for (var z = 1u; z < params.parts; z++) {
      v += acc[z * params.stride + i];
    }
    v += bv;
    acc[i] = v;
    best = max(best, select(u32(v), 0u - u32(v), v < 0));
  }
  if (params.want_max != 0u && best > 0u) {
    atomicMax(&state[params.slot], best);
  }
}
