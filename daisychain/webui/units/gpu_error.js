// The error a GPU path raises when the adapter, a kernel or a device cannot be used: the
// tab then computes on the CPU and says why (gpu.js, gpu_resident.js).

export class GpuError extends Error {
  constructor(message) {
    super(message);
    this.name = "GpuError";
  }
}
