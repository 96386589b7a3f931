/*
 * The model's RoPE inverse-frequency table, computed once per model from config.json's
 * rope_theta and rope_scaling (model.h: gang_rope_inv_freq). The semantics of each type
 * are transformers' (modeling_rope_utils.py of 4.46): the table is computed in double
 * and rounded to f32 once, as transformers keeps it in f32; the kernels then take the
 * angles in double from it (kernels.h: gang_kernels_rope).
 */
#include <math.h>
#include <stddef.h>

#include "ganglion/model.h"

#define ROPE_PI 3.14159265358979323846

/*
 * Llama 3.1's rescale of one plain inverse frequency: wavelengths shorter than
 * original / high_freq_factor are kept, longer than original / low_freq_factor divided
 * by factor, and those between blended linearly in original / wavelength.
 */
static double rope_llama3(const gang_rope_scaling *r, double inv)
{
    double wavelen = 2.0 * ROPE_PI / inv, old = (double)r->orig_max_pos;
    double lo = (double)r->low_freq_factor, hi = (double)r->high_freq_factor;
    double smooth;

    if (wavelen < old / hi)
        return inv;
    if (wavelen > old / lo)
        return inv / (double)r->factor;
    smooth = (old / wavelen - lo) / (hi - lo);
    return (1.0 - smooth) * inv / (double)r->factor + smooth * inv;
}

/*
 * YaRN's table: pair i keeps its plain frequency (extrapolation) below the correction
 * range of beta_fast rotations, takes frequency / factor (interpolation) above the
 * range of beta_slow rotations, and a linear ramp over pair indices between. The range
 * is taken over max_position_embeddings, as transformers 4.46 does.
 */
static void rope_yarn(const gang_model_config *cfg, float *inv_freq)
{
    const gang_rope_scaling *r = &cfg->rope;
    double d = (double)cfg->head_dim, base = (double)cfg->rope_theta, ctx = (double)cfg->max_pos;
    double lo = floor(d * log(ctx / ((double)r->beta_fast * 2.0 * ROPE_PI)) / (2.0 * log(base)));
    double hi = ceil(d * log(ctx / ((double)r->beta_slow * 2.0 * ROPE_PI)) / (2.0 * log(base)));
    size_t half = cfg->head_dim / 2;

    lo = lo < 0.0 ? 0.0 : lo;
    hi = hi > d - 1.0 ? d - 1.0 : hi;
    if (lo == hi)
        hi += 0.001;
    for (size_t i = 0; i < half; i++) {
        double pos_freq = pow(base, (double)(2 * i) / d);
        double ramp = ((double)i - lo) / (hi - lo);
        double extra;

        ramp = ramp < 0.0 ? 0.0 : ramp > 1.0 ? 1.0 : ramp;
        extra = 1.0 - ramp;
        inv_freq[i] =
            (float)(1.0 / ((double)r->factor * pos_freq) * (1.0 - extra) + 1.0 / pos_freq * extra);
    }
}

int gang_rope_inv_freq(const gang_model_config *cfg, float *inv_freq, float *attn_scale)
{
    size_t half;

    if (cfg == NULL || inv_freq == NULL || attn_scale == NULL || cfg->head_dim == 0 ||
        cfg->head_dim % 2 != 0)
        return GANG_EINVAL;
    half = cfg->head_dim / 2;
    *attn_scale = 1.0f;
    if (cfg->rope.type == GANG_ROPE_YARN) {
        rope_yarn(cfg, inv_freq);
        *attn_scale = cfg->rope.attn_factor;
        return 0;
    }
    for (size_t i = 0; i < half; i++) {
        double inv = 1.0 / pow((double)cfg->rope_theta, (double)(2 * i) / (double)cfg->head_dim);

        if (cfg->rope.type == GANG_ROPE_LINEAR)
            inv /= (double)cfg->rope.factor;
        else if (cfg->rope.type == GANG_ROPE_LLAMA3)
            inv = rope_llama3(&cfg->rope, inv);
        inv_freq[i] = (float)inv;
    }
    return 0;
}
