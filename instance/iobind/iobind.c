#include "iobind.h"
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

static const OrtApi* api = NULL;
static OrtEnv* env = NULL;
static OrtMemoryInfo* host_mem = NULL;

// The CUDA runtime, loaded on first use (the CUDA provider has already loaded it).
typedef int (*cudaSetDevice_t)(int);
typedef int (*cudaMemcpy2D_t)(void*, size_t, const void*, size_t, size_t, size_t, int);
typedef int (*cudaMemset_t)(void*, int, size_t);
typedef int (*cudaDeviceSynchronize_t)(void);
typedef const char* (*cudaGetErrorString_t)(int);
static cudaSetDevice_t cu_set_device;
static cudaMemcpy2D_t cu_memcpy2d;
static cudaMemset_t cu_memset;
static cudaDeviceSynchronize_t cu_sync;
static cudaGetErrorString_t cu_err;

static char* msg(const char* what, const char* detail) {
	size_t n = strlen(what) + (detail ? strlen(detail) : 0) + 3;
	char* m = malloc(n);
	snprintf(m, n, "%s%s%s", what, detail ? ": " : "", detail ? detail : "");
	return m;
}

static char* status(OrtStatus* s, const char* what) {
	if (!s) return NULL;
	char* m = msg(what, api->GetErrorMessage(s));
	api->ReleaseStatus(s);
	return m;
}

char* vx_init(const char* ort_path) {
	if (api) return NULL;
	void* h = dlopen(ort_path, RTLD_NOW | RTLD_GLOBAL);
	if (!h) return msg("dlopen onnxruntime", dlerror());
	typedef const OrtApiBase* (*base_t)(void);
	base_t base = (base_t)dlsym(h, "OrtGetApiBase");
	if (!base) return msg("OrtGetApiBase", dlerror());
	api = base()->GetApi(ORT_API_VERSION);
	if (!api) return msg("onnxruntime does not offer C API version", "24");
	// ONNX Runtime keeps one environment per process: this returns the one onnxruntime_go made.
	char* e = status(api->CreateEnv(ORT_LOGGING_LEVEL_ERROR, "voxmux", &env), "CreateEnv");
	if (e) return e;
	return status(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, &host_mem), "CreateCpuMemoryInfo");
}

static char* load_cudart(void) {
	if (cu_memcpy2d) return NULL;
	const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
	void* h = NULL;
	for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
	if (!h) return msg("dlopen libcudart", dlerror());
	cu_set_device = (cudaSetDevice_t)dlsym(h, "cudaSetDevice");
	cu_memcpy2d = (cudaMemcpy2D_t)dlsym(h, "cudaMemcpy2D");
	cu_memset = (cudaMemset_t)dlsym(h, "cudaMemset");
	cu_sync = (cudaDeviceSynchronize_t)dlsym(h, "cudaDeviceSynchronize");
	cu_err = (cudaGetErrorString_t)dlsym(h, "cudaGetErrorString");
	if (!cu_set_device || !cu_memcpy2d || !cu_memset || !cu_sync || !cu_err) return msg("libcudart", "missing symbols");
	return NULL;
}

char* vx_session(const char* model, int cuda, int device, const char** keys, const char** values, int n_opts,
                 OrtSession** out_session, OrtMemoryInfo** out_mem, OrtAllocator** out_alloc, OrtIoBinding** out_binding) {
	OrtSessionOptions* so = NULL;
	char* e = status(api->CreateSessionOptions(&so), "CreateSessionOptions");
	if (e) return e;
	if (cuda) {
		if ((e = load_cudart())) { api->ReleaseSessionOptions(so); return e; }
		OrtCUDAProviderOptionsV2* co = NULL;
		e = status(api->CreateCUDAProviderOptions(&co), "cuda provider cannot be loaded");
		if (!e) e = status(api->UpdateCUDAProviderOptions(co, keys, values, n_opts), "cuda provider options");
		if (!e) e = status(api->SessionOptionsAppendExecutionProvider_CUDA_V2(so, co), "cuda provider cannot be loaded");
		if (co) api->ReleaseCUDAProviderOptions(co);
		if (e) { api->ReleaseSessionOptions(so); return e; }
	}
	e = status(api->CreateSession(env, model, so, out_session), "CreateSession");
	api->ReleaseSessionOptions(so);
	if (e) return e;
	if (cuda) {
		e = status(api->CreateMemoryInfo("Cuda", OrtArenaAllocator, device, OrtMemTypeDefault, out_mem), "CreateMemoryInfo");
	} else {
		e = status(api->CreateCpuMemoryInfo(OrtArenaAllocator, OrtMemTypeDefault, out_mem), "CreateCpuMemoryInfo");
	}
	if (!e) e = status(api->CreateAllocator(*out_session, *out_mem, out_alloc), "CreateAllocator");
	if (!e) e = status(api->CreateIoBinding(*out_session, out_binding), "CreateIoBinding");
	return e;
}

void vx_session_free(OrtSession* s, OrtMemoryInfo* mem, OrtAllocator* alloc, OrtIoBinding* b) {
	if (b) api->ReleaseIoBinding(b);
	if (alloc) api->ReleaseAllocator(alloc);
	if (mem) api->ReleaseMemoryInfo(mem);
	if (s) api->ReleaseSession(s);
}

char* vx_tensor(OrtAllocator* alloc, const int64_t* shape, size_t rank, int elem, OrtValue** out, void** data) {
	char* e = status(api->CreateTensorAsOrtValue(alloc, shape, rank, (ONNXTensorElementDataType)elem, out), "CreateTensorAsOrtValue");
	if (e) return e;
	return status(api->GetTensorMutableData(*out, data), "GetTensorMutableData");
}

char* vx_host_tensor(const int64_t* shape, size_t rank, int elem, OrtValue** out, void** data) {
	OrtAllocator* a = NULL;
	char* e = status(api->GetAllocatorWithDefaultOptions(&a), "GetAllocatorWithDefaultOptions");
	if (e) return e;
	return vx_tensor(a, shape, rank, elem, out, data);
}

void vx_release(OrtValue* v) { if (v) api->ReleaseValue(v); }

char* vx_bind_input(OrtIoBinding* b, const char* name, OrtValue* v) {
	return status(api->BindInput(b, name, v), name);
}

char* vx_bind_output_to(OrtIoBinding* b, const char* name, OrtMemoryInfo* mem) {
	return status(api->BindOutputToDevice(b, name, mem), name);
}

char* vx_bind_output_host(OrtIoBinding* b, const char* name) {
	return status(api->BindOutputToDevice(b, name, host_mem), name);
}

char* vx_run(OrtSession* s, OrtIoBinding* b, OrtValue*** outs, size_t* n) {
	char* e = status(api->RunWithBinding(s, NULL, b), "run");
	if (e) return e;
	if ((e = status(api->SynchronizeBoundOutputs(b), "SynchronizeBoundOutputs"))) return e;
	OrtAllocator* a = NULL;
	if ((e = status(api->GetAllocatorWithDefaultOptions(&a), "GetAllocatorWithDefaultOptions"))) return e;
	// The output array itself comes from the default allocator; the caller frees it with free().
	OrtValue** vals = NULL;
	if ((e = status(api->GetBoundOutputValues(b, a, &vals, n), "GetBoundOutputValues"))) return e;
	OrtValue** copy = malloc(sizeof(OrtValue*) * (*n ? *n : 1));
	memcpy(copy, vals, sizeof(OrtValue*) * *n);
	OrtStatus* fs = api->AllocatorFree(a, vals);
	if (fs) api->ReleaseStatus(fs);
	*outs = copy;
	return NULL;
}

void vx_clear(OrtIoBinding* b) {
	api->ClearBoundInputs(b);
	api->ClearBoundOutputs(b);
}

char* vx_info(OrtValue* v, void** data, int64_t* shape, size_t* rank, int* elem) {
	OrtTensorTypeAndShapeInfo* info = NULL;
	char* e = status(api->GetTensorTypeAndShape(v, &info), "GetTensorTypeAndShape");
	if (e) return e;
	size_t n = 0;
	ONNXTensorElementDataType t;
	e = status(api->GetDimensionsCount(info, &n), "GetDimensionsCount");
	if (!e && n > *rank) e = msg("tensor rank too large", NULL);
	if (!e) e = status(api->GetDimensions(info, shape, n), "GetDimensions");
	if (!e) e = status(api->GetTensorElementType(info, &t), "GetTensorElementType");
	api->ReleaseTensorTypeAndShapeInfo(info);
	if (e) return e;
	*rank = n;
	*elem = (int)t;
	return status(api->GetTensorMutableData(v, data), "GetTensorMutableData");
}

static char* cuda_check(int rc, const char* what) {
	if (rc == 0) return NULL;
	return msg(what, cu_err(rc));
}

char* vx_copy2d(int cuda, int device, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
	if (width == 0 || height == 0) return NULL;
	if (!cuda) {
		for (size_t i = 0; i < height; i++) memcpy((char*)dst + i * dpitch, (const char*)src + i * spitch, width);
		return NULL;
	}
	char* e = cuda_check(cu_set_device(device), "cudaSetDevice");
	if (!e) e = cuda_check(cu_memcpy2d(dst, dpitch, src, spitch, width, height, 4 /* cudaMemcpyDefault */), "cudaMemcpy2D");
	// ONNX Runtime runs on its own stream: finish the copy before the next run reads it.
	if (!e) e = cuda_check(cu_sync(), "cudaDeviceSynchronize");
	return e;
}

char* vx_zero(int cuda, int device, void* dst, size_t bytes) {
	if (bytes == 0) return NULL;
	if (!cuda) { memset(dst, 0, bytes); return NULL; }
	char* e = cuda_check(cu_set_device(device), "cudaSetDevice");
	if (!e) e = cuda_check(cu_memset(dst, 0, bytes), "cudaMemset");
	if (!e) e = cuda_check(cu_sync(), "cudaDeviceSynchronize");
	return e;
}
