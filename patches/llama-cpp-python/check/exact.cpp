// Exactness of the small-batch kernels: random Q4_K / Q6_K weights, MUL_MAT over 1..17, 25 and 33
// rows against ggml's one-row path (the same op with one activation row at a time), for the weights
// as llama.cpp holds them (Q4_K repacked, Q6_K plain) and Q4_K plain as a second reference.
// Prints the largest difference per row count, normalised by the rms of the reference outputs;
// writes the one-row outputs to argv[1] (to compare two builds bit for bit). Fails (exit 1) on a
// difference over 1e-5 of the rms, or on any difference at one row. usage: exact [dump] [threads]
#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

static ggml_backend_buffer_type_t repack_buft(ggml_backend_t be) {
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    auto get = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(reg, "ggml_backend_dev_get_extra_bufts");
    for (ggml_backend_buffer_type_t * p = get(dev); p && *p; ++p) {
        if (strcmp(ggml_backend_buft_name(*p), "CPU_REPACK") == 0) return *p;
    }
    return nullptr;
}

// y = W x for the first `rows` columns of x (k x 17 floats)
static std::vector<float> mul_mat(ggml_backend_t be, ggml_tensor * w, const std::vector<float> & x, int rows) {
    const int k = w->ne[0], n = w->ne[1];
    ggml_init_params gp = {ggml_tensor_overhead() * 4 + ggml_graph_overhead(), nullptr, true};
    ggml_context * cg = ggml_init(gp);
    ggml_tensor * xt = ggml_new_tensor_2d(cg, GGML_TYPE_F32, k, rows);
    ggml_tensor * y = ggml_mul_mat(cg, w, xt);
    ggml_cgraph * gr = ggml_new_graph(cg);
    ggml_build_forward_expand(gr, y);
    ggml_backend_buffer_t b = ggml_backend_alloc_ctx_tensors(cg, be);
    ggml_backend_tensor_set(xt, x.data(), 0, ggml_nbytes(xt));
    ggml_backend_graph_compute(be, gr);
    std::vector<float> out((size_t) n * rows);
    ggml_backend_tensor_get(y, out.data(), 0, out.size() * sizeof(float));
    ggml_backend_buffer_free(b);
    ggml_free(cg);
    return out;
}

int main(int argc, char ** argv) {
    FILE * dump = argc > 1 ? fopen(argv[1], "wb") : nullptr;
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, argc > 2 ? atoi(argv[2]) : 2);
    ggml_backend_buffer_type_t rb = repack_buft(be);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    int failures = 0;
    struct Case { ggml_type t; bool repack; int k; int n; };
    // n = 264: 16 columns groups plus one 8-column group (the gemm's AVX2 tail)
    Case cases[] = {{GGML_TYPE_Q4_K, true, 1536, 264}, {GGML_TYPE_Q4_K, true, 2816, 512},
                    {GGML_TYPE_Q4_K, false, 1536, 264}, {GGML_TYPE_Q6_K, false, 1536, 264},
                    {GGML_TYPE_Q6_K, false, 2816, 520}};
    for (const Case & c : cases) {
        ggml_init_params ip = {ggml_tensor_overhead() * 2, nullptr, true};
        ggml_context * cw = ggml_init(ip);
        ggml_tensor * w = ggml_new_tensor_2d(cw, c.t, c.k, c.n);
        ggml_backend_buffer_t bw = ggml_backend_alloc_ctx_tensors_from_buft(cw, c.repack ? rb : ggml_backend_cpu_buffer_type());
        std::vector<float> f((size_t) c.k * c.n);
        for (auto & v : f) v = nd(rng);
        std::vector<uint8_t> q(ggml_nbytes(w));
        ggml_quantize_chunk(c.t, f.data(), q.data(), 0, c.n, c.k, nullptr);
        ggml_backend_tensor_set(w, q.data(), 0, q.size());
        std::vector<float> x((size_t) c.k * 35);
        for (auto & v : x) v = nd(rng);

        // one-row reference per column
        std::vector<float> ref((size_t) c.n * 35);
        for (int r = 0; r < 35; r++) {
            std::vector<float> xr(x.begin() + (size_t) r * c.k, x.begin() + (size_t) (r + 1) * c.k);
            std::vector<float> y = mul_mat(be, w, xr, 1);
            memcpy(ref.data() + (size_t) r * c.n, y.data(), c.n * sizeof(float));
        }
        if (dump) fwrite(ref.data(), sizeof(float), ref.size(), dump);
        double rms = 0;
        for (float v : ref) rms += (double) v * v;
        rms = std::sqrt(rms / ref.size());
        printf("%s %s k=%d n=%d (rms %.3g): max |batch - one-row| / rms per row count:\n", ggml_type_name(c.t),
               c.repack ? "repacked" : "plain", c.k, c.n, rms);
        for (int rows = 1; rows <= 35; rows += rows < 17 ? 1 : 8) {
            std::vector<float> y = mul_mat(be, w, x, rows);
            double worst = 0;
            size_t n_exact = 0;
            for (size_t i = 0; i < y.size(); i++) {
                worst = std::max(worst, (double) std::fabs(y[i] - ref[i]) / rms);
                n_exact += y[i] == ref[i];
            }
            bool ok = worst < 1e-5 && (rows > 1 || worst == 0);
            failures += !ok;
            printf("  %2d: %.2e%s%s\n", rows, worst, n_exact == y.size() ? " (bit-identical)" : "", ok ? "" : "  FAIL");
        }
        ggml_backend_buffer_free(bw);
        ggml_free(cw);
    }
    if (dump) fclose(dump);
    printf(failures ? "FAILED %d\n" : "all ok\n", failures);
    return failures != 0;
}
