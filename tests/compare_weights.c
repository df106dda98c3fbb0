/*
 * compare_weights.c — a test tool: compares two safetensors files tensor by tensor.
 * usage: compare_weights A B RTOL   exits 0 when every tensor satisfies
 * ||a - b||_2 <= RTOL * ||b||_2 (relative difference of the tensor as a vector), and prints
 * the worst tensor.
 *
 * The key third of every attention bias (h.N.attn.c_attn.bias[C, 2C)) is left out: adding a
 * constant to every key shifts a query's scores uniformly, which softmax ignores, so its true
 * gradient is exactly zero and what it receives is rounding noise, which AdamW's normalisation
 * turns into lr-sized steps. Two correct runs that round differently (one process against
 * several) therefore disagree there by up to lr x steps; everything else must agree.
 */
#include "loom/io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: compare_weights A.safetensors B.safetensors RTOL\n");
        return 2;
    }
    double rtol = atof(argv[3]);
    loom_safetensors *a, *b;
    if (loom_safetensors_open(&a, argv[1]) || loom_safetensors_open(&b, argv[2])) {
        fprintf(stderr, "%s\n", loom_last_error());
        return 2;
    }
    int bad = 0;
    double worst = 0.0;
    const char *worst_name = "";
    if (loom_safetensors_count(a) != loom_safetensors_count(b)) {
        fprintf(stderr, "tensor counts differ\n");
        return 1;
    }
    for (int i = 0; i < loom_safetensors_count(a); i++) {
        const loom_st_entry *ea = loom_safetensors_entry(a, i);
        const loom_st_entry *eb = loom_safetensors_find(b, ea->name);
        if (!eb || eb->ndim != ea->ndim || eb->end - eb->begin != ea->end - ea->begin) {
            fprintf(stderr, "%s: missing or different shape in %s\n", ea->name, argv[2]);
            bad = 1;
            continue;
        }
        size_t n = (ea->end - ea->begin) / 4;
        float *x = malloc(n * 4 + 4), *y = malloc(n * 4 + 4);
        if (!x || !y) return 2;
        if (loom_safetensors_read_f32(a, ea->name, ea->ndim, ea->shape, 0, x) ||
            loom_safetensors_read_f32(b, ea->name, eb->ndim, eb->shape, 0, y)) {
            fprintf(stderr, "%s\n", loom_last_error());
            return 2;
        }
        size_t skip_begin = 0, skip_end = 0;
        size_t len = strlen(ea->name);
        if (len > 11 && strcmp(ea->name + len - 11, "c_attn.bias") == 0) {
            skip_begin = n / 3, skip_end = 2 * n / 3;
        }
        double diff2 = 0.0, ref2 = 0.0;
        for (size_t k = 0; k < n; k++) {
            if (k >= skip_begin && k < skip_end) continue;
            diff2 += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            ref2 += (double)y[k] * y[k];
        }
        double rel = ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2);
        if (rel > worst) worst = rel, worst_name = ea->name;
        if (!(rel <= rtol)) bad = 1;
        free(x), free(y);
    }
    printf("worst relative difference %.3g (%s)\n", worst, worst_name);
    loom_safetensors_close(a), loom_safetensors_close(b);
    return bad;
}
