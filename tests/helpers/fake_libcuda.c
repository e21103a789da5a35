/* A stand-in for libcuda.so.1 with the entry points nvrtc_gather/jit/driver.py binds, so the
   ctypes signatures, argument order and out-parameters are exercised in CI without a GPU.
   Two devices: 0 is an sm_90 with 132 SMs, 1 an sm_80 with 108. fake_* functions let the
   test set results and read what the driver was given. Built by tests/jit/test_driver_library.py. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream, *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

static int init_result = 0, libraries = 0, kernels = 0, launches = 0;
static void *ctx_stack[16];
static int ctx_depth = 0;       /* ctx_stack[0] is the thread's current context when depth is 0 */
static unsigned last_grid, last_block;
static void *last_stream, *last_function;
static unsigned char last_params[64];
static char kernel_names[64][128];

void fake_set_init_result(int r) { init_result = r; }
void fake_set_current(void *ctx) { ctx_depth = 0; ctx_stack[0] = ctx; }
int fake_ctx_depth(void) { return ctx_depth; }
int fake_launches(void) { return launches; }
unsigned fake_last_grid(void) { return last_grid; }
unsigned fake_last_block(void) { return last_block; }
void *fake_last_stream(void) { return last_stream; }
void *fake_last_function(void) { return last_function; }
const unsigned char *fake_last_params(void) { return last_params; }
const char *fake_kernel_name(void *function) {  /* the name a CUfunction was fetched by */
    intptr_t k = (intptr_t)function - 0x100000 - 0x3000;
    return k >= 0 && k < kernels ? kernel_names[k] : "";
}

static void *current(void) { return ctx_stack[ctx_depth]; }

int cuInit(unsigned flags) { return flags ? 1 : init_result; }
int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuDeviceGetCount(int *n) { *n = 2; return 0; }
int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal > 1) return 101;  /* CUDA_ERROR_INVALID_DEVICE */
    *dev = ordinal;
    return 0;
}
int cuDeviceGetAttribute(int *pi, int attribute, int dev) {
    if (dev < 0 || dev > 1) return 101;
    switch (attribute) {
        case 75: *pi = dev ? 8 : 9; return 0;      /* COMPUTE_CAPABILITY_MAJOR */
        case 76: *pi = 0; return 0;                /* COMPUTE_CAPABILITY_MINOR */
        case 16: *pi = dev ? 108 : 132; return 0;  /* MULTIPROCESSOR_COUNT */
        default: return 1;
    }
}
int cuDeviceGetName(char *name, int len, int dev) { snprintf(name, (size_t)len, "Fake GPU %d", dev); return 0; }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) { *ctx = (void *)(intptr_t)(0x1000 + dev); return 0; }
int cuLibraryLoadData(void **lib, const void *code, void *o1, void *o2, unsigned n1, void *o3, void *o4, unsigned n2) {
    if (o1 || o2 || n1 || o3 || o4 || n2) return 1;
    if (memcmp(code, "\x7f" "ELF", 4) != 0 && memcmp(code, "//", 2) != 0) return 200;  /* INVALID_IMAGE */
    *lib = (void *)(intptr_t)(0x2000 + ++libraries);
    return 0;
}
int cuLibraryUnload(void *lib) { return lib ? 0 : 400; }
int cuLibraryGetKernel(void **kernel, void *lib, const char *name) {
    if (!lib || kernels == 64 || strlen(name) >= 128) return 400;
    if (strcmp(name, "missing") == 0) return 500;  /* CUDA_ERROR_NOT_FOUND */
    strcpy(kernel_names[kernels], name);
    *kernel = (void *)(intptr_t)(0x3000 + kernels++);
    return 0;
}
int cuKernelGetFunction(void **function, void *kernel) {
    if (!current()) return 201;  /* INVALID_CONTEXT */
    *function = (char *)kernel + 0x100000;
    return 0;
}
int cuCtxGetCurrent(void **ctx) { *ctx = current(); return 0; }
int cuCtxPushCurrent_v2(void *ctx) {
    if (ctx_depth == 15) return 1;
    ctx_stack[++ctx_depth] = ctx;
    return 0;
}
int cuCtxPopCurrent_v2(void **ctx) {
    if (ctx_depth == 0) return 201;
    *ctx = ctx_stack[ctx_depth--];
    return 0;
}
int cuStreamIsCapturing(void *stream, int *status) { *status = stream == (void *)0xCA97 ? 1 : 0; return 0; }
int cuLaunchKernelEx(const CUlaunchConfig *cfg, void *function, void **params, void **extra) {
    if (!current()) return 201;
    if (extra || cfg->gridDimY != 1 || cfg->blockDimY != 1 || cfg->numAttrs) return 1;
    last_grid = cfg->gridDimX;
    last_block = cfg->blockDimX;
    last_stream = cfg->hStream;
    last_function = function;
    memcpy(last_params, params[0], sizeof last_params);
    launches++;
    return 0;
}
int cuGetErrorName(int error, const char **name) {
    switch (error) {
        case 0: *name = "CUDA_SUCCESS"; return 0;
        case 1: *name = "CUDA_ERROR_INVALID_VALUE"; return 0;
        case 34: *name = "CUDA_ERROR_STUB_LIBRARY"; return 0;
        case 100: *name = "CUDA_ERROR_NO_DEVICE"; return 0;
        case 101: *name = "CUDA_ERROR_INVALID_DEVICE"; return 0;
        case 200: *name = "CUDA_ERROR_INVALID_IMAGE"; return 0;
        case 201: *name = "CUDA_ERROR_INVALID_CONTEXT"; return 0;
        case 500: *name = "CUDA_ERROR_NOT_FOUND"; return 0;
        default: *name = 0; return 1;
    }
}
