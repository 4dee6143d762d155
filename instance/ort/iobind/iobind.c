#include "iobind.h"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static const OrtApi* api = NULL;
static OrtEnv* env = NULL;
static OrtMemoryInfo* host_mem = NULL;

// The CUDA runtime, loaded on first use (the CUDA provider has already loaded it).
// Copies run on a stream of our own and wait only for it: a device-wide synchronisation, or work on
// the legacy default stream, is refused while ONNX Runtime or cuDNN capture a CUDA graph on another
// thread, and would stall the other sessions on the GPU anyway.
typedef int (*cudaSetDevice_t)(int);
typedef int (*cudaMemcpy2DAsync_t)(void*, size_t, const void*, size_t, size_t, size_t, int, void*);
typedef int (*cudaMemsetAsync_t)(void*, int, size_t, void*);
typedef int (*cudaStreamCreateWithFlags_t)(void**, unsigned int);
typedef int (*cudaStreamSynchronize_t)(void*);
typedef int (*cudaThreadExchangeStreamCaptureMode_t)(int*);
typedef const char* (*cudaGetErrorString_t)(int);
typedef int (*cudaDeviceGetStreamPriorityRange_t)(int*, int*);
typedef int (*cudaStreamCreateWithPriority_t)(void**, unsigned int, int);
typedef int (*cudaStreamDestroy_t)(void*);
typedef int (*cudaHostAlloc_t)(void**, size_t, unsigned int);
typedef int (*cudaFreeHost_t)(void*);
typedef int (*cudaMemcpyAsync_t)(void*, const void*, size_t, int, void*);
static cudaSetDevice_t cu_set_device;
static cudaMemcpy2DAsync_t cu_memcpy2d;
static cudaMemsetAsync_t cu_memset;
static cudaStreamCreateWithFlags_t cu_stream_create;
static cudaStreamSynchronize_t cu_stream_sync;
static cudaThreadExchangeStreamCaptureMode_t cu_capture_mode;
static cudaGetErrorString_t cu_err;
static cudaDeviceGetStreamPriorityRange_t cu_priority_range;
static cudaStreamCreateWithPriority_t cu_stream_create_priority;
static cudaStreamDestroy_t cu_stream_destroy;
static cudaHostAlloc_t cu_host_alloc;
static cudaFreeHost_t cu_free_host;
static cudaMemcpyAsync_t cu_memcpy;
typedef int (*cudaMemGetInfo_t)(size_t*, size_t*);
static cudaMemGetInfo_t cu_mem_get_info;
#define VX_MAX_DEVICES 64
static void* streams[VX_MAX_DEVICES];
static pthread_mutex_t streams_mu = PTHREAD_MUTEX_INITIALIZER;

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

static char* cuda_check(int rc, const char* what) {
	if (rc == 0) return NULL;
	return msg(what, cu_err(rc));
}

// priority_stream makes a non-blocking stream of the current device's highest priority.
static char* priority_stream(void** stream) {
	int least = 0, greatest = 0;
	char* e = cuda_check(cu_priority_range(&least, &greatest), "cudaDeviceGetStreamPriorityRange");
	if (!e) e = cuda_check(cu_stream_create_priority(stream, 1 /* cudaStreamNonBlocking */, greatest), "cudaStreamCreateWithPriority");
	return e;
}

static char* load_cudart(void) {
	if (cu_memcpy2d) return NULL;
	const char* names[] = {"libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL};
	void* h = NULL;
	for (int i = 0; names[i] && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_GLOBAL);
	if (!h) return msg("dlopen libcudart", dlerror());
	cu_set_device = (cudaSetDevice_t)dlsym(h, "cudaSetDevice");
	cu_memcpy2d = (cudaMemcpy2DAsync_t)dlsym(h, "cudaMemcpy2DAsync");
	cu_memset = (cudaMemsetAsync_t)dlsym(h, "cudaMemsetAsync");
	cu_stream_create = (cudaStreamCreateWithFlags_t)dlsym(h, "cudaStreamCreateWithFlags");
	cu_stream_sync = (cudaStreamSynchronize_t)dlsym(h, "cudaStreamSynchronize");
	cu_capture_mode = (cudaThreadExchangeStreamCaptureMode_t)dlsym(h, "cudaThreadExchangeStreamCaptureMode");
	cu_err = (cudaGetErrorString_t)dlsym(h, "cudaGetErrorString");
	cu_priority_range = (cudaDeviceGetStreamPriorityRange_t)dlsym(h, "cudaDeviceGetStreamPriorityRange");
	cu_stream_create_priority = (cudaStreamCreateWithPriority_t)dlsym(h, "cudaStreamCreateWithPriority");
	cu_stream_destroy = (cudaStreamDestroy_t)dlsym(h, "cudaStreamDestroy");
	cu_host_alloc = (cudaHostAlloc_t)dlsym(h, "cudaHostAlloc");
	cu_free_host = (cudaFreeHost_t)dlsym(h, "cudaFreeHost");
	cu_memcpy = (cudaMemcpyAsync_t)dlsym(h, "cudaMemcpyAsync");
	cu_mem_get_info = (cudaMemGetInfo_t)dlsym(h, "cudaMemGetInfo");
	if (!cu_set_device || !cu_memcpy2d || !cu_memset || !cu_stream_create || !cu_stream_sync || !cu_capture_mode || !cu_err ||
	    !cu_priority_range || !cu_stream_create_priority || !cu_stream_destroy || !cu_host_alloc || !cu_free_host || !cu_memcpy || !cu_mem_get_info)
		return msg("libcudart", "missing symbols");
	return NULL;
}

// stream, when not NULL, is the CUDA stream the session computes on (user_compute_stream).
char* vx_session(const char* model, const void* data, size_t data_len, int cuda, int device, void* stream, const char* profile, const char** keys, const char** values, int n_opts,
                 OrtSession** out_session, OrtMemoryInfo** out_mem, OrtAllocator** out_alloc, OrtIoBinding** out_binding) {
	OrtSessionOptions* so = NULL;
	char* e = status(api->CreateSessionOptions(&so), "CreateSessionOptions");
	if (!e && profile) e = status(api->EnableProfiling(so, profile), "EnableProfiling");
	if (e) { if (so) api->ReleaseSessionOptions(so); return e; }
	if (cuda) {
		if ((e = load_cudart())) { api->ReleaseSessionOptions(so); return e; }
		OrtCUDAProviderOptionsV2* co = NULL;
		e = status(api->CreateCUDAProviderOptions(&co), "cuda provider cannot be loaded");
		if (!e) e = status(api->UpdateCUDAProviderOptions(co, keys, values, n_opts), "cuda provider options");
		if (!e && stream) e = status(api->UpdateCUDAProviderOptionsWithValue(co, "user_compute_stream", stream), "cuda provider option user_compute_stream");
		if (!e) e = status(api->SessionOptionsAppendExecutionProvider_CUDA_V2(so, co), "cuda provider cannot be loaded");
		if (co) api->ReleaseCUDAProviderOptions(co);
		if (e) { api->ReleaseSessionOptions(so); return e; }
	}
	if (data) e = status(api->CreateSessionFromArray(env, data, data_len, so, out_session), "CreateSessionFromArray");
	else e = status(api->CreateSession(env, model, so, out_session), "CreateSession");
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

char* vx_bind_output_value(OrtIoBinding* b, const char* name, OrtValue* v) {
	return status(api->BindOutput(b, name, v), name);
}

char* vx_view(OrtMemoryInfo* mem, void* data, size_t bytes, const int64_t* shape, size_t rank, int elem, OrtValue** out) {
	if (!mem) mem = host_mem;
	return status(api->CreateTensorWithDataAsOrtValue(mem, data, bytes, shape, rank, (ONNXTensorElementDataType)elem, out),
	              "CreateTensorWithDataAsOrtValue");
}

char* vx_bind_output_host(OrtIoBinding* b, const char* name) {
	return status(api->BindOutputToDevice(b, name, host_mem), name);
}

// stream: the session's compute stream (NULL on the CPU). The run ends by waiting for that stream
// alone: ONNX Runtime flushes at the end of a run only streams it made itself, and its
// SynchronizeBoundOutputs waits for the whole device (the CUDA provider's Sync is
// cudaDeviceSynchronize), so every LM step waited for the flow step in flight on another stream
// and each flow worker for the other's (on an H200 the server went from 293.3× to 309.8× at 256 streams, voxmux 3b8e191 against 0a922c1).
char* vx_run(OrtSession* s, OrtIoBinding* b, const char* graph_id, void* stream, OrtValue*** outs, size_t* n) {
	OrtRunOptions* ro = NULL;
	char* e = NULL;
	if (graph_id) {
		e = status(api->CreateRunOptions(&ro), "CreateRunOptions");
		if (!e) e = status(api->AddRunConfigEntry(ro, "gpu_graph_id", graph_id), "run option gpu_graph_id");
		if (e) { if (ro) api->ReleaseRunOptions(ro); return e; }
	}
	e = status(api->RunWithBinding(s, ro, b), "run");
	if (ro) api->ReleaseRunOptions(ro);
	if (e) return e;
	if (stream && (e = cuda_check(cu_stream_sync(stream), "cudaStreamSynchronize"))) return e;
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


// cuda_begin makes device current and returns its stream, in relaxed capture mode so that another
// thread's graph capture does not forbid our calls; cuda_end restores the mode.
static char* cuda_begin(int device, void** stream, int* mode) {
	if (device < 0 || device >= VX_MAX_DEVICES) return msg("device index out of range", NULL);
	*mode = 2; // cudaStreamCaptureModeRelaxed
	char* e = cuda_check(cu_capture_mode(mode), "cudaThreadExchangeStreamCaptureMode");
	if (e) return e;
	if ((e = cuda_check(cu_set_device(device), "cudaSetDevice"))) return e;
	pthread_mutex_lock(&streams_mu);
	// Highest priority: the cache copies are short and the LM waits on them, so they go ahead of
	// other sessions' queued kernels.
	if (!streams[device]) e = priority_stream(&streams[device]);
	*stream = streams[device];
	pthread_mutex_unlock(&streams_mu);
	return e;
}

static char* cuda_end(void* stream, int mode, char* e) {
	if (!e && stream) e = cuda_check(cu_stream_sync(stream), "cudaStreamSynchronize");
	cu_capture_mode(&mode);
	return e;
}

char* vx_copy2d(int cuda, int device, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
	if (width == 0 || height == 0) return NULL;
	if (!cuda) {
		for (size_t i = 0; i < height; i++) memcpy((char*)dst + i * dpitch, (const char*)src + i * spitch, width);
		return NULL;
	}
	void* stream = NULL;
	int mode;
	char* e = cuda_begin(device, &stream, &mode);
	if (!e) e = cuda_check(cu_memcpy2d(dst, dpitch, src, spitch, width, height, 4 /* cudaMemcpyDefault */, stream), "cudaMemcpy2DAsync");
	// Only queued: the caller waits with vx_sync before the next ONNX Runtime run reads it.
	return cuda_end(NULL, mode, e);
}

char* vx_copy_across(int device, void* dst, const void* src, size_t bytes) {
	if (bytes == 0) return NULL;
	void* stream = NULL;
	int mode;
	char* e = cuda_begin(device, &stream, &mode);
	if (!e) e = cuda_check(cu_memcpy2d(dst, bytes, src, bytes, bytes, 1, 4 /* cudaMemcpyDefault */, stream), "cudaMemcpy2DAsync");
	return cuda_end(stream, mode, e);
}

char* vx_sync(int device) {
	void* stream = NULL;
	int mode;
	char* e = cuda_begin(device, &stream, &mode);
	return cuda_end(stream, mode, e);
}

char* vx_zero(int cuda, int device, void* dst, size_t bytes) {
	if (bytes == 0) return NULL;
	if (!cuda) { memset(dst, 0, bytes); return NULL; }
	void* stream = NULL;
	int mode;
	char* e = cuda_begin(device, &stream, &mode);
	if (!e) e = cuda_check(cu_memset(dst, 0, bytes, stream), "cudaMemsetAsync");
	return cuda_end(stream, mode, e);
}

// vx_mem_info reads the device's free and total memory (cudaMemGetInfo).
char* vx_mem_info(int device, size_t* free_b, size_t* total_b) {
	char* e = load_cudart();
	if (!e) e = cuda_check(cu_set_device(device), "cudaSetDevice");
	if (!e) e = cuda_check(cu_mem_get_info(free_b, total_b), "cudaMemGetInfo");
	return e;
}

void vx_stream_free(void* stream) {
	if (stream && cu_stream_destroy) cu_stream_destroy(stream);
}

char* vx_stream(int device, int high_priority, void** stream) {
	char* e = load_cudart();
	if (!e) e = cuda_check(cu_set_device(device), "cudaSetDevice");
	if (e) return e;
	if (high_priority) return priority_stream(stream);
	return cuda_check(cu_stream_create(stream, 1 /* cudaStreamNonBlocking */), "cudaStreamCreateWithFlags");
}

// Page-locked host memory, which the GPU's copy engines read and write directly: a copy from
// pageable memory goes through a driver buffer and holds the calling thread until it is done.
char* vx_pinned(size_t bytes, void** out) {
	char* e = load_cudart();
	if (e) return e;
	int mode = 2; // relaxed: another thread may be capturing a CUDA graph
	if ((e = cuda_check(cu_capture_mode(&mode), "cudaThreadExchangeStreamCaptureMode"))) return e;
	e = cuda_check(cu_host_alloc(out, bytes ? bytes : 1, 1 /* cudaHostAllocPortable */), "cudaHostAlloc");
	cu_capture_mode(&mode);
	return e;
}

void vx_pinned_free(void* p) {
	if (!p) return;
	int mode = 2;
	cu_capture_mode(&mode);
	cu_free_host(p);
	cu_capture_mode(&mode);
}

char* vx_copy_on(void* stream, void* dst, const void* src, size_t bytes) {
	if (bytes == 0) return NULL;
	int mode = 2;
	char* e = cuda_check(cu_capture_mode(&mode), "cudaThreadExchangeStreamCaptureMode");
	if (e) return e;
	e = cuda_check(cu_memcpy(dst, src, bytes, 4 /* cudaMemcpyDefault */, stream), "cudaMemcpyAsync");
	cu_capture_mode(&mode);
	return e;
}

char* vx_copy2d_on(int device, void* stream, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height) {
	if (width == 0 || height == 0) return NULL;
	int mode = 2; // relaxed: another thread may be capturing a CUDA graph
	char* e = cuda_check(cu_capture_mode(&mode), "cudaThreadExchangeStreamCaptureMode");
	if (e) return e;
	e = cuda_check(cu_set_device(device), "cudaSetDevice");
	if (!e) e = cuda_check(cu_memcpy2d(dst, dpitch, src, spitch, width, height, 4 /* cudaMemcpyDefault */, stream), "cudaMemcpy2DAsync");
	cu_capture_mode(&mode);
	return e;
}

char* vx_zero_on(int device, void* stream, void* dst, size_t bytes) {
	if (bytes == 0) return NULL;
	int mode = 2;
	char* e = cuda_check(cu_capture_mode(&mode), "cudaThreadExchangeStreamCaptureMode");
	if (e) return e;
	e = cuda_check(cu_set_device(device), "cudaSetDevice");
	if (!e) e = cuda_check(cu_memset(dst, 0, bytes, stream), "cudaMemsetAsync");
	cu_capture_mode(&mode);
	return e;
}

char* vx_wait(void* stream) {
	return cuda_check(cu_stream_sync(stream), "cudaStreamSynchronize");
}

char* vx_binding(OrtSession* s, const char* graph_id, int queue_only, OrtIoBinding** out_binding, OrtRunOptions** out_ro) {
	char* e = status(api->CreateIoBinding(s, out_binding), "CreateIoBinding");
	if (!e) e = status(api->CreateRunOptions(out_ro), "CreateRunOptions");
	if (!e) e = status(api->AddRunConfigEntry(*out_ro, "gpu_graph_id", graph_id), "run option gpu_graph_id");
	// Without it a run ends in the CUDA provider's OnRunEnd, which waits for the session's stream.
	if (!e && queue_only)
		e = status(api->AddRunConfigEntry(*out_ro, "disable_synchronize_execution_providers", "1"),
		           "run option disable_synchronize_execution_providers");
	return e;
}

void vx_binding_free(OrtIoBinding* b, OrtRunOptions* ro) {
	if (b) api->ReleaseIoBinding(b);
	if (ro) api->ReleaseRunOptions(ro);
}

char* vx_run_bound(OrtSession* s, OrtIoBinding* b, OrtRunOptions* ro) {
	return status(api->RunWithBinding(s, ro, b), "run");
}
