package ort

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

// The CUDA driver API, loaded at run time so that CPU-only hosts need no CUDA at all.
typedef int (*cuInit_t)(unsigned int);
typedef int (*cuDeviceGetCount_t)(int*);
typedef int (*cuDeviceGet_t)(int*, int);
typedef int (*cuDeviceGetName_t)(char*, int, int);
typedef int (*cuDeviceGetUuid_t)(unsigned char*, int);
typedef int (*cuDeviceTotalMem_t)(size_t*, int);

typedef struct { int ok; int count; } vx_cuda_count;

static void* vx_libcuda(void) {
	static void* h = 0;
	if (!h) h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
	return h;
}

// vx_cuda_devices returns -1 when the driver cannot be loaded or initialised.
static int vx_cuda_devices(void) {
	void* h = vx_libcuda();
	if (!h) return -1;
	cuInit_t init = (cuInit_t)dlsym(h, "cuInit");
	cuDeviceGetCount_t count = (cuDeviceGetCount_t)dlsym(h, "cuDeviceGetCount");
	if (!init || !count || init(0) != 0) return -1;
	int n = 0;
	if (count(&n) != 0) return -1;
	return n;
}

static int vx_cuda_device(int i, char* name, int nameLen, unsigned char* uuid, size_t* mem) {
	void* h = vx_libcuda();
	if (!h) return -1;
	cuDeviceGet_t get = (cuDeviceGet_t)dlsym(h, "cuDeviceGet");
	cuDeviceGetName_t getName = (cuDeviceGetName_t)dlsym(h, "cuDeviceGetName");
	cuDeviceGetUuid_t getUuid = (cuDeviceGetUuid_t)dlsym(h, "cuDeviceGetUuid_v2");
	if (!getUuid) getUuid = (cuDeviceGetUuid_t)dlsym(h, "cuDeviceGetUuid");
	cuDeviceTotalMem_t totalMem = (cuDeviceTotalMem_t)dlsym(h, "cuDeviceTotalMem_v2");
	if (!get || !getName || !getUuid || !totalMem) return -1;
	int dev;
	if (get(&dev, i) != 0) return -1;
	if (getName(name, nameLen, dev) != 0) return -1;
	if (getUuid(uuid, dev) != 0) return -1;
	if (totalMem(mem, dev) != 0) return -1;
	return 0;
}
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/voxmux/voxmux/tts"
)

type GPU struct {
	// Index is the device's ordinal inside this process (0 is the group's first GPU).
	Index       int
	UUID        string
	Name        string
	MemoryTotal uint64
}

// CUDADevices lists the CUDA devices this process can see; nil with no driver or no device.
func CUDADevices() []tts.GPU {
	n := int(C.vx_cuda_devices())
	var out []tts.GPU
	for i := 0; i < n; i++ {
		var name [256]C.char
		var uuid [16]C.uchar
		var mem C.size_t
		if C.vx_cuda_device(C.int(i), &name[0], C.int(len(name)), &uuid[0], &mem) != 0 {
			continue
		}
		u := C.GoBytes(unsafe.Pointer(&uuid[0]), 16)
		out = append(out, tts.GPU{
			Index:       i,
			UUID:        fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16]),
			Name:        C.GoString(&name[0]),
			MemoryTotal: uint64(mem),
		})
	}
	return out
}
