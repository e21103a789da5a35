// Runs a CUDA C kernel file of cuda_src/ on the host, for tests on machines without a GPU
// (tests/test_quant_emulated.py, tests/test_gather_emulated.py). Each block is NG_THREADS real threads: __syncthreads is a
// block barrier, warp shuffles exchange through a per-warp barrier (so a shuffle that not all
// 32 lanes reach hangs here as it would misbehave on a GPU), __shared__ is a static (blocks
// run one after another). Intrinsics get their IEEE meaning. Vector loads (__ldg) and vector
// stores that are not aligned to their size, which fault on a GPU, are counted (emu_faults).
// Build (KERNEL_FILE = the .cu):
//   g++ -std=c++20 -O1 -ffp-contract=off -fno-fast-math -pthread -shared -fPIC
//       -I cuda_src -DKERNEL_FILE='"quant_cache.cu"' -DKERNEL_PARAMS=QuantParams cuda_host_emu.cpp
#include <atomic>
#include <barrier>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define NG_EMU_THREADS 256  // NG_THREADS of common.cuh, checked below

static std::atomic<int> emu_fault_count{0};
static inline void emu_check_align(const void* p, unsigned long n) {
    if ((unsigned long)p % n) emu_fault_count++;
}
struct uint2 {
    unsigned int x, y;
    uint2& operator=(const uint2& o) { emu_check_align(this, 8); x = o.x; y = o.y; return *this; }
};
struct uint4 {
    unsigned int x, y, z, w;
    uint4& operator=(const uint4& o) { emu_check_align(this, 16); x = o.x; y = o.y; z = o.z; w = o.w; return *this; }
};
static inline uint2 make_uint2(unsigned int a, unsigned int b) { return uint2{a, b}; }
struct int2 { int x, y; };
static inline int2 make_int2(int a, int b) { return int2{a, b}; }
struct EmuIdx { unsigned int x; };
static thread_local EmuIdx threadIdx, blockIdx;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __shared__ static

template <class T> static inline T __ldg(const T* p) { emu_check_align(p, sizeof(T)); return *p; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    const unsigned long long v = ((unsigned long long)y << 32) | x;
    unsigned int r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline int __ffs(int x) { return __builtin_ffs(x); }
static inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz((unsigned int)x); }
static inline int __popc(unsigned int x) { return __builtin_popcount(x); }
using std::max;
using std::min;

static float emu_half_to_float(unsigned short h) {
    const unsigned int sign = (unsigned int)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    float mag;
    if (e == 0x1f) mag = __uint_as_float(0x7f800000u | (m << 13));
    else if (e == 0) mag = (float)m * (1.0f / 16777216.0f);  // m * 2^-24, exact
    else mag = __uint_as_float(((e + 112) << 23) | (m << 13));
    return __uint_as_float(__float_as_uint(mag) | sign);
}
// The one inline-asm statement in the kernels: cvt.f32.f16 %0, %1 with operands (f, h).
#define asm(...) (f = emu_half_to_float(h))

static std::mutex emu_atomic_mutex;
static unsigned int atomicMax(unsigned int* p, unsigned int v) {
    std::lock_guard<std::mutex> g(emu_atomic_mutex);
    const unsigned int old = *p;
    if (v > old) *p = v;
    return old;
}
static unsigned long long atomicCAS(unsigned long long* p, unsigned long long cmp, unsigned long long v) {
    std::lock_guard<std::mutex> g(emu_atomic_mutex);
    const unsigned long long old = *p;
    if (old == cmp) *p = v;
    return old;
}

struct EmuBlock {
    std::barrier<> block{NG_EMU_THREADS};
    std::vector<std::barrier<>*> warps;
    unsigned int lanes[NG_EMU_THREADS];
    EmuBlock() { for (int w = 0; w < NG_EMU_THREADS / 32; ++w) warps.push_back(new std::barrier<>(32)); }
    ~EmuBlock() { for (auto* w : warps) delete w; }
};
static EmuBlock* emu_block;

static void __syncthreads() { emu_block->block.arrive_and_wait(); }
static unsigned int __shfl_xor_sync(unsigned int mask, unsigned int v, int lane_mask) {
    if (mask != 0xffffffffu) throw "only full-warp shuffles are emulated";
    const unsigned int t = threadIdx.x, warp = t / 32;
    emu_block->lanes[t] = v;
    emu_block->warps[warp]->arrive_and_wait();
    const unsigned int r = emu_block->lanes[(t & ~31u) | ((t & 31u) ^ (unsigned int)lane_mask)];
    emu_block->warps[warp]->arrive_and_wait();
    return r;
}

static unsigned int __ballot_sync(unsigned int mask, bool pred) {
    if (mask != 0xffffffffu) throw "only full-warp ballots are emulated";
    const unsigned int t = threadIdx.x, warp = t / 32;
    emu_block->lanes[t] = pred;
    emu_block->warps[warp]->arrive_and_wait();
    unsigned int r = 0;
    for (unsigned int l = 0; l < 32; ++l) r |= (emu_block->lanes[warp * 32 + l] ? 1u : 0u) << l;
    emu_block->warps[warp]->arrive_and_wait();
    return r;
}

#include KERNEL_FILE

static_assert(NG_THREADS == NG_EMU_THREADS, "emulator block size");

typedef void (*EmuKernel)(const KERNEL_PARAMS);

// Misaligned vector accesses since the last call.
extern "C" int emu_faults() { return emu_fault_count.exchange(0); }

// Launch `kernel` over `grid` blocks of NG_THREADS threads with the packed parameter bytes.
extern "C" int emu_launch(EmuKernel kernel, const void* params, int grid) {
    KERNEL_PARAMS p;
    std::memcpy(&p, params, sizeof p);
    for (int b = 0; b < grid; ++b) {
        EmuBlock block;
        emu_block = &block;
        std::vector<std::thread> threads;
        for (unsigned int t = 0; t < NG_THREADS; ++t) {
            threads.emplace_back([=] {
                threadIdx.x = t;
                blockIdx.x = (unsigned int)b;
                kernel(p);
            });
        }
        for (auto& th : threads) th.join();
    }
    return (int)sizeof p;
}
