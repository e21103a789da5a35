// Runs a CUDA C kernel file of cuda_src/ on the host, for tests on machines without a GPU
// (tests/emulator/). Each block is NG_THREADS real threads: __syncthreads is a
// block barrier, warp shuffles exchange through a per-warp barrier (so a shuffle that not all
// 32 lanes reach hangs here as it would misbehave on a GPU), __shared__ is a static (blocks
// run one after another). Intrinsics get their IEEE meaning. Vector loads (__ldg) and vector
// stores that are not aligned to their size, which fault on a GPU, are counted (emu_faults).
// Optionally (emu_set_bounds) every __ldg must lie inside given address ranges: one outside is
// counted (emu_oob) and reads zeros instead of touching memory. emu_launch_isolated runs
// launches in a forked child, so that a stray access that faults ends the child, not the caller.
// Build (KERNEL_FILE = the .cu, KERNEL_ENTRIES = a file of the entry points the specs generate,
// and the spec's -D constants; tests/helpers/host_emu.py does it):
//   g++ -std=c++20 -O1 -ffp-contract=off -fno-fast-math -pthread -shared -fPIC -I cuda_src
//       -DKERNEL_FILE='"quant_cache.cu"' -DKERNEL_ENTRIES='"entries.inc"' -DKERNEL_PARAMS=QuantParams
//       -DNG_THREADS=256 -DNG_QUNROLL=4 cuda_host_emu.cpp
#include <atomic>
#include <barrier>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define NG_EMU_THREADS NG_THREADS  // the module's threads per block (-DNG_THREADS from its spec)

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
static inline uint4 make_uint4(unsigned int a, unsigned int b, unsigned int c, unsigned int d) { return uint4{a, b, c, d}; }
struct int2 { int x, y; };
static inline int2 make_int2(int a, int b) { return int2{a, b}; }
struct EmuIdx { unsigned int x; };
static thread_local EmuIdx threadIdx, blockIdx, gridDim;

#define __device__
#define __global__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

// [lo, hi) address ranges __ldg may read; empty: any. Set between launches only.
static std::vector<std::pair<unsigned long, unsigned long>> emu_bounds;
static std::atomic<int> emu_oob_count{0};
static inline bool emu_readable(const void* p, unsigned long n) {
    if (emu_bounds.empty()) return true;
    const unsigned long a = (unsigned long)p;
    for (const auto& r : emu_bounds) {
        if (a >= r.first && a <= r.second && n <= r.second - a) return true;
    }
    return false;
}
template <class T> static inline T __ldg(const T* p) {
    emu_check_align(p, sizeof(T));
    if (!emu_readable(p, sizeof(T))) {
        emu_oob_count++;
        return T{};
    }
    return *p;
}
static inline unsigned int __float_as_uint(float f) { unsigned int u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned int u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __frcp_rn(float a) { return 1.0f / a; }
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
    unsigned long long seq[NG_EMU_THREADS];  // each thread's count of warp-collective calls (divergence check)
    std::vector<std::barrier<>*> warps;
    unsigned int lanes[NG_EMU_THREADS];
    int votes[NG_EMU_THREADS];
    EmuBlock() { for (int w = 0; w < NG_EMU_THREADS / 32; ++w) warps.push_back(new std::barrier<>(32)); }
    ~EmuBlock() { for (auto* w : warps) delete w; }
};
static EmuBlock* emu_block;

static void __syncthreads() { emu_block->block.arrive_and_wait(); }

// A warp-collective call (shuffle, ballot) made by some lanes of a warp and not others is
// undefined on the GPU (it hung the H200 once); here the lanes would pair calls from different
// places. Each thread counts its collective calls in its block; lanes whose counts differ at a
// call are a divergence, counted for emu_divergent().
static thread_local unsigned long long emu_collectives = 0;
static std::atomic<int> emu_divergent_count{0};
static void emu_warp_enter(unsigned int t) { emu_block->seq[t] = ++emu_collectives; }
static void emu_warp_check(unsigned int t) {
    if (emu_block->seq[t] != emu_block->seq[t & ~31u]) emu_divergent_count++;
}
// A barrier that also returns whether pred was non-zero in any thread of the block.
static int __syncthreads_or(int pred) {
    emu_block->votes[threadIdx.x] = pred != 0;
    emu_block->block.arrive_and_wait();
    int r = 0;
    for (int t = 0; t < NG_EMU_THREADS; ++t) r |= emu_block->votes[t];
    emu_block->block.arrive_and_wait();  // every thread has read the votes before the next call
    return r;
}
static unsigned int __shfl_xor_sync(unsigned int mask, unsigned int v, int lane_mask) {
    if (mask != 0xffffffffu) throw "only full-warp shuffles are emulated";
    const unsigned int t = threadIdx.x, warp = t / 32;
    emu_block->lanes[t] = v;
    emu_warp_enter(t);
    emu_block->warps[warp]->arrive_and_wait();
    emu_warp_check(t);
    const unsigned int r = emu_block->lanes[(t & ~31u) | ((t & 31u) ^ (unsigned int)lane_mask)];
    emu_block->warps[warp]->arrive_and_wait();
    return r;
}

static int __shfl_sync(unsigned int mask, int v, int src_lane) {
    if (mask != 0xffffffffu) throw "only full-warp shuffles are emulated";
    const unsigned int t = threadIdx.x, warp = t / 32;
    emu_block->lanes[t] = (unsigned int)v;
    emu_warp_enter(t);
    emu_block->warps[warp]->arrive_and_wait();
    emu_warp_check(t);
    const int r = (int)emu_block->lanes[(t & ~31u) | ((unsigned int)src_lane & 31u)];
    emu_block->warps[warp]->arrive_and_wait();
    return r;
}

static unsigned int __ballot_sync(unsigned int mask, bool pred) {
    if (mask != 0xffffffffu) throw "only full-warp ballots are emulated";
    const unsigned int t = threadIdx.x, warp = t / 32;
    emu_block->lanes[t] = pred;
    emu_warp_enter(t);
    emu_block->warps[warp]->arrive_and_wait();
    emu_warp_check(t);
    unsigned int r = 0;
    for (unsigned int l = 0; l < 32; ++l) r |= (emu_block->lanes[warp * 32 + l] ? 1u : 0u) << l;
    emu_block->warps[warp]->arrive_and_wait();
    return r;
}

#include KERNEL_FILE
#include KERNEL_ENTRIES  // the extern "C" entry points the modules' specs generate (host_emu.py)

static_assert(NG_EMU_THREADS % 32 == 0 && NG_EMU_THREADS <= 1024, "emulator block size: whole warps, at most 1024");

typedef void (*EmuKernel)(const KERNEL_PARAMS);

// Misaligned vector accesses since the last call.
extern "C" int emu_faults() { return emu_fault_count.exchange(0); }

// Warp-collective calls some lanes of a warp made and others did not, since the last call.
extern "C" int emu_divergent() { return emu_divergent_count.exchange(0); }

// __ldg's outside the bounds since the last call.
extern "C" int emu_oob() { return emu_oob_count.exchange(0); }

// Bounds for __ldg: n ranges, ranges[2i] <= address < ranges[2i + 1]; n = 0: none.
extern "C" void emu_set_bounds(const unsigned long long* ranges, int n) {
    emu_bounds.clear();
    for (int i = 0; i < n; ++i) emu_bounds.emplace_back(ranges[2 * i], ranges[2 * i + 1]);
}

// n launches one after another, each block of each by the same NG_THREADS threads (a barrier
// between blocks): launch i runs kernels[i] over grids[i] blocks with the parameter struct at
// params + i * sizeof(KERNEL_PARAMS). before(i) runs before launch i and after(i) once it has
// finished, while every thread waits.
template <class Before, class After>
static void emu_run(int n, const EmuKernel* kernels, const char* params, const int* grids, Before before,
                    After after) {
    if (n <= 0) return;
    EmuBlock block;
    emu_block = &block;
    int launch = 0, done_blocks = 0;  // the barrier's phases so far: blocks of `launch` (a grid of 0: one)
    auto next = [&]() noexcept {
        if (++done_blocks < max(grids[launch], 1)) return;
        after(launch);
        done_blocks = 0;
        if (++launch < n) before(launch);
    };
    std::barrier<decltype(next)> next_block(NG_THREADS, next);
    before(0);
    std::vector<std::thread> threads;
    for (unsigned int t = 0; t < NG_THREADS; ++t) {
        threads.emplace_back([&, t] {
            threadIdx.x = t;
            for (int i = 0; i < n; ++i) {
                KERNEL_PARAMS p;
                std::memcpy(&p, params + (size_t)i * sizeof p, sizeof p);
                gridDim.x = (unsigned int)grids[i];
                for (int b = 0; b < max(grids[i], 1); ++b) {
                    blockIdx.x = (unsigned int)b;
                    emu_collectives = 0;
                    if (b < grids[i]) kernels[i](p);
                    next_block.arrive_and_wait();
                }
            }
        });
    }
    for (auto& th : threads) th.join();
}

// Launch `kernel` over `grid` blocks of NG_THREADS threads with the packed parameter bytes.
extern "C" int emu_launch(EmuKernel kernel, const void* params, int grid) {
    emu_run(1, &kernel, (const char*)params, &grid, [](int) {}, [](int) {});
    return (int)sizeof(KERNEL_PARAMS);
}

// n launches, one after another, in a forked child: a fault or a hang ends the child, not the
// caller. Launch i runs kernels[i] over grids[i] blocks with the params_size bytes at
// params + i * params_size, its __ldg's bounded by the next nranges[i] pairs of ranges (see
// emu_set_bounds). The kernels' memory must be a shared mapping (MAP_SHARED) for their writes
// to show here. out[3i], out[3i + 1], out[3i + 2]: 1 once launch i finished, its misaligned
// accesses, its out-of-bounds loads. Returns 0 when the child finished them all, -signal when a
// signal ended it, -1000 when a launch ran past timeout_ms (then killed), below -1000 when it could
// not run (-1005: params_size is not the parameter struct's size).
extern "C" int emu_launch_isolated(int n, const EmuKernel* kernels, const char* params, int params_size,
                                   const int* grids, const unsigned long long* ranges, const int* nranges,
                                   int timeout_ms, int* out) {
    if (params_size != (int)sizeof(KERNEL_PARAMS)) return -1005;
    const size_t bytes = sizeof(int) * 3 * (size_t)(n > 0 ? n : 1);
    int* shared = (int*)mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return -1001;
    std::memset(shared, 0, bytes);
    const pid_t pid = fork();
    if (pid < 0) {
        munmap(shared, bytes);
        return -1002;
    }
    if (pid == 0) {
        // A crash is an expected outcome: no core file, no handler of the caller's (such as
        // Python's faulthandler) reporting it.
        const rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, SIG_DFL);
        emu_faults();
        emu_oob();
        emu_run(
            n, kernels, params, grids,
            [&](int i) {
                emu_set_bounds(ranges, nranges[i]);
                ranges += 2 * nranges[i];
            },
            [&](int i) {
                shared[3 * i + 1] = emu_faults();
                shared[3 * i + 2] = emu_oob();
                __atomic_store_n(&shared[3 * i], 1, __ATOMIC_RELEASE);  // the parent restarts its clock
            });
        _exit(0);
    }
    timespec t0, now;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int status = 0, rc = 0, finished = 0;
    for (;;) {
        const pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (w < 0 && errno != EINTR) {
            rc = -1003;
            break;
        }
        // timeout_ms for each launch, not the batch: a loaded machine (16 test workers, each
        // launch's blocks 256 threads at barriers) took over 60 s for 40 quick launches
        while (finished < n && __atomic_load_n(&shared[3 * finished], __ATOMIC_ACQUIRE)) {
            ++finished;
            clock_gettime(CLOCK_MONOTONIC, &t0);
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        if ((now.tv_sec - t0.tv_sec) * 1000 + (now.tv_nsec - t0.tv_nsec) / 1000000 > timeout_ms) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            rc = -1000;
            break;
        }
        usleep(200);
    }
    std::memcpy(out, shared, bytes);
    munmap(shared, bytes);
    if (rc) return rc;
    if (WIFSIGNALED(status)) return -WTERMSIG(status);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1004;
}
