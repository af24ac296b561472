// The bias of a linear or conv layer on the resident path (webui/units/gpu_plan.js), added
// to its GEMM accumulator in place, and max |acc| of the result (res_absmax.wgsl's, for the
// requantize that follows) in one pass: acc[r * n_out + o] += bias[t * n_out + o], t =
// state[tin] the shifts summed below this layer, i.e. the row of the bias table the host
// computed for every exponent the accumulator can have (layers.js biasAcc: |bias| <= 2^30, and
// the layer's in-features bound keeps the sum in int32; t beyond the table is clamped to its
// last row, and the host checks the shifts it reads back); then, when want_max != 0,
// state[slot] = max(state[slot], |acc|) as u32 (|-2^31| = 2^31 fits).
// One invocation per row r < rows, the n_out columns in order: no division per element.
// Dispatch: 64 invocations per workgroup, row r = (wid.y * num_workgroups.x + wid.x) * 64 + lid.x.

struct Params {
  rows: u32, n_out: u32, tin: u32, table_rows: u32,
  slot: u32, want_max: u32, _pad0: u32, _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> bias: array<i32>;
@group(0) @binding(2) var<storage, read_write> acc: array<i32>;
@group(0) @binding(3) var<storage, read_write> state: array<atomic<u32>>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let r = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (r >= params.rows) {
    return;
  }
  let n = params.n_out;
  let t = min(atomicLoad(&state[params.tin]), params.table_rows - 1u);
  let row = r * n;
  let brow = t * n;
  var best = 0u;
  for (var o = 0u; o < n; o++) {
    let v = acc[row + o] + bias[brow + o];
    acc[row + o] = v;
    best = max(best, select(u32(v), 0u - u32(v), v < 0));
  }
  if (params.want_max != 0u && best > 0u) {
    atomicMax(&state[params.slot], best);
  }
}
