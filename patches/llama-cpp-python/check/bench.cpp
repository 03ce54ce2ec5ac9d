// Per-type, per-row-count MUL_MAT microbenchmark with the default target's shapes
// (Qwen2.5-Coder-1.5B Q4_K_M: 28 layers, hidden 1536, ffn 8960, kv 256, vocab 151936).
// Weights as llama.cpp loads them: Q4_K in the CPU_REPACK buffer (8x8 interleave on AVX2+),
// Q6_K in the plain CPU buffer. Groups are run in turn, so ~1 GB of weights cycles through
// the caches and each group's weights come mostly from memory, as in a forward.
//
// usage: bench [iters] [rows...]
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

struct W { const char * name; ggml_type type; int k; int n; int group; };

// CPUTIME=1: process CPU time instead of wall time (the host is shared; with one thread this counts
// the work and the memory stalls of the kernel, not the time other processes hold the core)
static double now_ms() {
    static const bool cpu = getenv("CPUTIME") != nullptr;
    if (cpu) {
        timespec ts;
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
        return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
    }
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static ggml_backend_buffer_type_t repack_buft(ggml_backend_t be) {
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * p = get(dev); p && *p; ++p) {
        if (strcmp(ggml_backend_buft_name(*p), "CPU_REPACK") == 0) return *p;
    }
    return nullptr;
}

static double read_bandwidth_gbs(size_t bytes, int nthreads) {
    std::vector<uint64_t> buf(bytes / 8);
    for (size_t i = 0; i < buf.size(); i++) buf[i] = i;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        std::vector<uint64_t> sums(nthreads * 8);
        double t0 = now_ms();
        std::vector<std::thread> th;
        for (int t = 0; t < nthreads; t++) {
            th.emplace_back([&, t] {
                size_t n = buf.size() / nthreads, b = t * n;
                uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                for (size_t i = b; i < b + n; i += 4) { s0 += buf[i]; s1 += buf[i + 1]; s2 += buf[i + 2]; s3 += buf[i + 3]; }
                sums[t * 8] = s0 + s1 + s2 + s3;
            });
        }
        for (auto & x : th) x.join();
        best = std::min(best, now_ms() - t0);
        if (sums[0] == 42) printf(" ");
    }
    return bytes / best / 1e6;
}

int main(int argc, char ** argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 5;
    std::vector<int> rows_list;
    for (int i = 2; i < argc; i++) rows_list.push_back(atoi(argv[i]));
    if (rows_list.empty()) rows_list = {1, 2, 3, 4, 5, 8, 9, 16, 17, 33};
    const int nthreads = getenv("NT") ? atoi(getenv("NT")) : 2, n_layer = 28, hid = 1536, ffn = 8960, kv = 256, vocab = 151936;

    std::vector<W> ws;
    for (int il = 0; il < n_layer; il++) {
        bool more = il < n_layer / 8 || il >= 7 * n_layer / 8 || (il - n_layer / 8) % 3 == 2;
        ggml_type vd = more ? GGML_TYPE_Q6_K : GGML_TYPE_Q4_K;
        ws.push_back({"attn_q", GGML_TYPE_Q4_K, hid, hid, 0});
        ws.push_back({"attn_k", GGML_TYPE_Q4_K, hid, kv, 0});
        ws.push_back({"attn_v", vd, hid, kv, more ? 1 : 0});
        ws.push_back({"attn_output", GGML_TYPE_Q4_K, hid, hid, 0});
        ws.push_back({"ffn_gate", GGML_TYPE_Q4_K, hid, ffn, 0});
        ws.push_back({"ffn_up", GGML_TYPE_Q4_K, hid, ffn, 0});
        ws.push_back({"ffn_down", vd, ffn, hid, more ? 1 : 0});
    }
    ws.push_back({"output", GGML_TYPE_Q6_K, hid, vocab, 2});
    const char * gname[3] = {"Q4_K (repacked, layers)", "Q6_K (attn_v/ffn_down)", "Q6_K output"};

    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, nthreads);
    ggml_backend_buffer_type_t rb = repack_buft(be);
    ggml_backend_buffer_type_t cb = ggml_backend_cpu_buffer_type();
    bool no_repack = getenv("NO_REPACK") != nullptr;

    // weights: one context per buffer type
    ggml_init_params ip = {ggml_tensor_overhead() * (ws.size() + 8), nullptr, true};
    ggml_context * cq = ggml_init(ip);
    ggml_context * cp = ggml_init(ip);
    std::vector<ggml_tensor *> wt;
    size_t bytes[3] = {0, 0, 0};
    for (auto & w : ws) {
        bool rep = w.type == GGML_TYPE_Q4_K && rb && !no_repack;
        ggml_tensor * t = ggml_new_tensor_2d(rep ? cq : cp, w.type, w.k, w.n);
        wt.push_back(t);
        bytes[w.group] += ggml_nbytes(t);
    }
    ggml_backend_buffer_t bq = ggml_backend_alloc_ctx_tensors_from_buft(cq, (rb && !no_repack) ? rb : cb);
    ggml_backend_buffer_t bp = ggml_backend_alloc_ctx_tensors_from_buft(cp, cb);
    (void) bq; (void) bp;
    // random weights: quantize a few distinct random matrices per shape, reuse them
    std::mt19937 rng(1234);
    std::normal_distribution<float> nd(0.0f, 0.02f);
    std::vector<std::pair<std::string, std::vector<uint8_t>>> cache;
    for (size_t i = 0; i < ws.size(); i++) {
        std::string key = std::to_string(ws[i].type) + ":" + std::to_string(ws[i].k) + ":" + std::to_string(ws[i].n);
        std::vector<uint8_t> * q = nullptr;
        for (auto & c : cache) if (c.first == key) q = &c.second;
        if (!q) {
            size_t nel = (size_t) ws[i].k * ws[i].n;
            std::vector<float> f(nel);
            for (auto & x : f) x = nd(rng);
            cache.push_back({key, std::vector<uint8_t>(ggml_nbytes(wt[i]))});
            q = &cache.back().second;
            ggml_quantize_chunk(ws[i].type, f.data(), q->data(), 0, ws[i].n, ws[i].k, nullptr);
        }
        ggml_backend_tensor_set(wt[i], q->data(), 0, q->size());
    }
    double bw = read_bandwidth_gbs((size_t) 1 << 30, nthreads);
    printf("read bandwidth (%d threads, 1 GiB): %.1f GB/s\n", nthreads, bw); if (0) printf(": %.1f GB/s\n", bw);
    for (int g = 0; g < 3; g++) {
        printf("group %-26s %8.1f MB  stream %.2f ms\n", gname[g], bytes[g] / 1e6, bytes[g] / 1e6 / bw);
    }
    printf("%5s %10s %10s %10s %10s | x1: %6s %6s %6s %6s\n", "rows", "Q4K_ms", "Q6K_ms", "out_ms", "total_ms", "Q4K", "Q6K", "out", "total");

    double base[4] = {0, 0, 0, 0};
    for (int rows : rows_list) {
        ggml_init_params gp = {ggml_tensor_overhead() * (ws.size() * 2 + 16) + ggml_graph_overhead_custom(1024, false) * 3, nullptr, true};
        ggml_context * cg = ggml_init(gp);
        ggml_tensor * xh = ggml_new_tensor_2d(cg, GGML_TYPE_F32, hid, rows);
        ggml_tensor * xf = ggml_new_tensor_2d(cg, GGML_TYPE_F32, ffn, rows);
        ggml_cgraph * gr[3];
        for (int g = 0; g < 3; g++) gr[g] = ggml_new_graph_custom(cg, 1024, false);
        for (size_t i = 0; i < ws.size(); i++) {
            ggml_tensor * y = ggml_mul_mat(cg, wt[i], ws[i].k == hid ? xh : xf);
            ggml_build_forward_expand(gr[ws[i].group], y);
        }
        ggml_backend_buffer_t ba = ggml_backend_alloc_ctx_tensors(cg, be);
        std::vector<float> xv((size_t) ffn * rows);
        std::uniform_real_distribution<float> ud(-1.f, 1.f);
        for (auto & x : xv) x = ud(rng);
        ggml_backend_tensor_set(xh, xv.data(), 0, ggml_nbytes(xh));
        ggml_backend_tensor_set(xf, xv.data(), 0, ggml_nbytes(xf));
        std::vector<std::vector<double>> tt(3);
        for (int it = 0; it < iters + 1; it++) {
            for (int g = 0; g < 3; g++) {
                double t0 = now_ms();
                ggml_backend_graph_compute(be, gr[g]);
                if (it > 0) tt[g].push_back(now_ms() - t0);
            }
        }
        double med[4];
        med[3] = 0;
        for (int g = 0; g < 3; g++) {
            std::sort(tt[g].begin(), tt[g].end());
            med[g] = tt[g][0];  // minimum: the host is shared
            med[3] += med[g];
        }
        if (rows == 1) for (int g = 0; g < 4; g++) base[g] = med[g];
        printf("%5d %10.2f %10.2f %10.2f %10.2f", rows, med[0], med[1], med[2], med[3]);
        if (base[3] > 0) printf(" | x1: %6.2f %6.2f %6.2f %6.2f", med[0] / base[0], med[1] / base[1], med[2] / base[2], med[3] / base[3]);
        printf("\n");
        fflush(stdout);
        ggml_backend_buffer_free(ba);
        ggml_free(cg);
    }
    return 0;
}
