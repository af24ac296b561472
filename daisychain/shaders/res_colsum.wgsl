// A layer's bias gradient on the resident path: out[off + o] = sum over r < rows of
// g[r * n_out + o] (int8 errors; the host keeps rows * 127 below 2^31). One invocation per
// output, the rows in order; split over rows as the GEMMs are over K: workgroup z sums the
// rows [z * rc, min(rows, (z + 1) * rc)) into out[off + z * n_out + o] (rc 0: all rows), and
// res_reduce.wgsl adds the partials.
// Dispatch: (ceil(n_out / 64), 1, ceil(rows / rc)) workgroups of 64.

struct Params {
  rows: u32, n_out: u32, off: u32, rc: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> g: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
  let o = gid.x;
  if (o >= params.n_out) {
    return;
  }
  let rc = select(params.rc, params.rows, params.rc == 0u);
  let r0 = gid.z * rc;
  let r1 = min(params.rows, r0 + rc);
  var s = 0;
  for (var r = r0; r < r1; r++) {
    s += g[r * params.n_out + o];
  }
  out[params.off + gid.z * params.n_out + o] = s;
}
