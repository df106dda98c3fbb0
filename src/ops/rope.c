/*
 * rope.c — the rotary frequencies every backend and the references share: theta^(-2i/hd), with
 * Llama 3.1's scaling of the long wavelengths (Hugging Face's rope_type "llama3").
 */
#include "loom/ops.h"

#include <math.h>

double loom_rope_inv_freq(const loom_rope *rope, int i, int hd) {
    double freq = pow(rope->theta, -2.0 * (double)i / (double)hd);
    const loom_rope_scaling *s = &rope->scaling;
    if (!(s->factor > 0)) return freq;
    double wavelength = 2.0 * 3.14159265358979323846 / freq;                 /* 2 pi / freq */
    if (wavelength < s->original_context / s->high_freq_factor) return freq; /* short: kept */
    if (wavelength > s->original_context / s->low_freq_factor) return freq / s->factor;
    double a = (s->original_context / wavelength - s->low_freq_factor) /
               (s->high_freq_factor - s->low_freq_factor);
    return (1.0 - a) * freq / s->factor + a * freq;
}
