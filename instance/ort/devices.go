package ort

// Devices is the number of devices a group's engines run on: every visible GPU on the CUDA
// provider, one otherwise. With no GPU visible on CUDA it is still 1, so that device 0 fails with
// ONNX Runtime's own reason.
func Devices(provider string) int {
	if provider != "cuda" {
		return 1
	}
	return max(1, len(CUDADevices()))
}
