// A conv's rows <-> channel-major copy on the resident path (engine/layers.js Conv2d):
//   dir 0: (b*hw, co) -> (b, co*hw):  out[(s*co + c)*hw + p] = x[(s*hw + p)*co + c]
//   dir 1: (b, co*hw) -> (b*hw, co):  out[(s*hw + p)*co + c] = x[(s*co + c)*hw + p]
// Dispatch: 64 invocations per workgroup, element i = (wid.y * num_workgroups.x + wid.x) * 64
// + lid.x; invocation i writes out[i].

struct Params {
  n: u32, hw: u32, co: u32, dir: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> x: array<i32>;
@group(0) @binding(2) var<storage, read_write> out: array<i32>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_id) lid: vec3<u32>) {
  let i = (wid.y * nwg.x + wid.x) * 64u + lid.x;
  if (i >= params.n) {
    return;
  }
  let hw = params.hw;
  let co = params.co;
  if (params.dir == 0u) {
    let s = i / (co * hw);
    let c = (i / hw) % co;
    out[i] = x[(s * hw + i % hw) * co + c];
  } else {
    let r = i / co;
    out[i] = x[((r / hw) * co + i % co) * hw + r % hw];
  }
}
