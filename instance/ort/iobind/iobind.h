// A small layer over ONNX Runtime's C API for sessions whose tensors stay on a device (CUDA or
// the CPU): onnxruntime_go creates tensors in CPU memory only and cannot bind outputs to a device.
#ifndef VOXMUX_IOBIND_H
#define VOXMUX_IOBIND_H
#include <stddef.h>
#include <stdint.h>
#include "onnxruntime_c_api.h"

// Every function returns NULL on success or an error message the caller must free().
char* vx_init(const char* ort_path);
// model is a file's path, or with data set, the name of the model serialized in data[0, data_len).
char* vx_session(const char* model, const void* data, size_t data_len, int cuda, int device, void* stream, const char* profile, const char** keys, const char** values, int n_opts,
                 OrtSession** out_session, OrtMemoryInfo** out_mem, OrtAllocator** out_alloc, OrtIoBinding** out_binding);
void vx_session_free(OrtSession* s, OrtMemoryInfo* mem, OrtAllocator* alloc, OrtIoBinding* b);
char* vx_tensor(OrtAllocator* alloc, const int64_t* shape, size_t rank, int elem, OrtValue** out, void** data);
char* vx_host_tensor(const int64_t* shape, size_t rank, int elem, OrtValue** out, void** data);
void vx_release(OrtValue* v);
char* vx_bind_input(OrtIoBinding* b, const char* name, OrtValue* v);
char* vx_bind_output_to(OrtIoBinding* b, const char* name, OrtMemoryInfo* mem);
char* vx_bind_output_host(OrtIoBinding* b, const char* name);
// Binds an output to an existing value, which the run then writes in place.
char* vx_bind_output_value(OrtIoBinding* b, const char* name, OrtValue* v);
// Wraps memory the caller owns (on mem's device) as a tensor; releasing it leaves the memory alone.
char* vx_view(OrtMemoryInfo* mem, void* data, size_t bytes, const int64_t* shape, size_t rank, int elem, OrtValue** out);
// graph_id, when not NULL, is the run's gpu_graph_id: the CUDA graph the run captures or replays
// in a session with enable_cuda_graph ("-1": none). stream, when not NULL, is the session's
// compute stream, which the run waits for (and for nothing else on the device).
char* vx_run(OrtSession* s, OrtIoBinding* b, const char* graph_id, void* stream, OrtValue*** outs, size_t* n);
void vx_clear(OrtIoBinding* b);
char* vx_info(OrtValue* v, void** data, int64_t* shape, size_t* rank, int* elem);
// Copies rows of width bytes: dst[dpitch*i] <- src[spitch*i] for i < height; on the CUDA device
// when cuda is set (only queued there: vx_sync waits for every queued copy), in host memory otherwise.
char* vx_copy2d(int cuda, int device, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
char* vx_sync(int device);
// Copies bytes between host and device memory (either way) and waits for the copy.
char* vx_copy_across(int device, void* dst, const void* src, size_t bytes);
char* vx_zero(int cuda, int device, void* dst, size_t bytes);
char* vx_mem_info(int device, size_t* free_b, size_t* total_b);
// Makes a non-blocking stream on device, of its highest priority when high_priority is set.
char* vx_stream(int device, int high_priority, void** stream);
void vx_stream_free(void* stream);
// Page-locked host memory of bytes (cudaHostAlloc), freed with vx_pinned_free.
char* vx_pinned(size_t bytes, void** out);
void vx_pinned_free(void* p);
// Queues a copy of bytes on stream (host and device memory either way) without waiting for it;
// vx_wait waits for everything queued on the stream.
char* vx_copy_on(void* stream, void* dst, const void* src, size_t bytes);
char* vx_wait(void* stream);
// Queue a 2D copy (vx_copy2d's) or a clear on stream, a stream of device, without waiting.
char* vx_copy2d_on(int device, void* stream, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height);
char* vx_zero_on(int device, void* stream, void* dst, size_t bytes);
// A binding of its own for runs that bind the same values every time (a CUDA graph's replays),
// with run options naming graph_id (as vx_run's); vx_run_bound runs it and does not wait for the
// session's stream itself. With queue_only the CUDA provider does not wait for it either: the run
// only queues its kernels on the stream.
char* vx_binding(OrtSession* s, const char* graph_id, int queue_only, OrtIoBinding** out_binding, OrtRunOptions** out_ro);
void vx_binding_free(OrtIoBinding* b, OrtRunOptions* ro);
char* vx_run_bound(OrtSession* s, OrtIoBinding* b, OrtRunOptions* ro);
#endif
