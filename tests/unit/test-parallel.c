/* cmocka tests of the parallel module: topology (rank placement, layer split, TP shards). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "ganglion/comm.h"
#include "ganglion/config.h"
#include "ganglion/parallel.h"
#include "comm-backend.h"

static const uint32_t tp_values[] = {1, 2, 4, 8};
static const uint32_t pp_values[] = {1, 2, 3};
/* Per-rank nproc values tried for each world; only those that divide the world are used. */
static const uint32_t nproc_values[] = {1, 2, 3, 4, 6, 8, 12, 16, 24};
/* Layer counts chosen so that pp = 2 and pp = 3 both hit even and uneven splits. */
static const uint32_t layer_values[] = {3, 7, 12, 13};
/* kv head counts: split (>= tp), exactly tp, and replicated (< tp). */
static const uint32_t kv_values[] = {1, 2, 4, 8, 16, 32};

/* A valid 2-node, tp = 4, pp = 2 llama-like layout that the refusal cases perturb. */
static gang_topology_config base_config(void)
{
    gang_topology_config c;

    memset(&c, 0, sizeof(c));
    c.nnodes = 2;
    c.nproc_per_node = 4;
    c.tp = 4;
    c.pp = 2;
    c.allow_cross_node_tp = 0;
    c.n_layers = 7;
    c.n_heads = 32;
    c.n_kv_heads = 8;
    c.ffn = 11008;
    c.hidden = 4096;
    c.vocab = 32001;
    return c;
}

/* Checks placement of every rank of t: unique, reversible, consecutive TP groups. */
static void check_ranks(const gang_topology *t)
{
    uint8_t seen[256];
    uint32_t r;

    assert_true(t->world_size <= sizeof(seen));
    memset(seen, 0, sizeof(seen));
    for (r = 0; r < t->world_size; r++) {
        gang_rank_place p;
        uint32_t back = UINT32_MAX;

        assert_int_equal(gang_topology_rank(t, r, &p), 0);
        assert_int_equal(p.rank, r);
        assert_true(p.node < t->nnodes);
        assert_true(p.local_rank < t->nproc_per_node);
        assert_int_equal(p.node * t->nproc_per_node + p.local_rank, r);
        assert_true(p.pp_stage < t->pp);
        assert_true(p.tp_rank < t->tp);
        /* (stage, tp_rank) is a bijection onto the ranks. */
        assert_int_equal(seen[p.pp_stage * t->tp + p.tp_rank], 0);
        seen[p.pp_stage * t->tp + p.tp_rank] = 1;
        assert_int_equal(gang_topology_rank_at(t, p.pp_stage, p.tp_rank, &back), 0);
        assert_int_equal(back, r);

        /* The TP group is [first, first + tp), consecutive, and contains r at tp_rank. */
        assert_int_equal(p.tp_group_first_rank + p.tp_rank, r);
        assert_int_equal(p.tp_group_first_rank % t->tp, 0);
        for (uint32_t k = 0; k < t->tp; k++) {
            gang_rank_place q;

            assert_int_equal(gang_topology_rank(t, p.tp_group_first_rank + k, &q), 0);
            assert_int_equal(q.tp_rank, k);
            assert_int_equal(q.pp_stage, p.pp_stage);
            assert_int_equal(q.tp_group_first_rank, p.tp_group_first_rank);
            if (!t->tp_cross_node)
                assert_int_equal(q.node, p.node);
        }

        /* Pipeline neighbours keep the tp_rank and sit in the adjacent stages. */
        if (p.pp_stage == 0) {
            assert_int_equal(p.pp_prev_rank, -1);
        } else {
            gang_rank_place q;

            assert_true(p.pp_prev_rank >= 0);
            assert_int_equal(gang_topology_rank(t, (uint32_t)p.pp_prev_rank, &q), 0);
            assert_int_equal(q.tp_rank, p.tp_rank);
            assert_int_equal(q.pp_stage + 1, p.pp_stage);
            assert_int_equal(q.pp_next_rank, (int32_t)r);
        }
        if (p.pp_stage + 1 == t->pp) {
            assert_int_equal(p.pp_next_rank, -1);
        } else {
            gang_rank_place q;

            assert_true(p.pp_next_rank >= 0);
            assert_int_equal(gang_topology_rank(t, (uint32_t)p.pp_next_rank, &q), 0);
            assert_int_equal(q.tp_rank, p.tp_rank);
            assert_int_equal(q.pp_stage, p.pp_stage + 1);
            assert_int_equal(q.pp_prev_rank, (int32_t)r);
        }
    }
    for (r = 0; r < t->world_size; r++)
        assert_int_equal(seen[r], 1);
}

/* Checks that the stages' layer ranges partition [0, n_layers) in order, front-loaded. */
static void check_stage_layers(const gang_topology *t)
{
    uint32_t next = 0;
    uint32_t base = t->n_layers / t->pp;
    uint32_t extra = t->n_layers % t->pp;

    for (uint32_t s = 0; s < t->pp; s++) {
        uint32_t first = UINT32_MAX, count = UINT32_MAX;

        assert_int_equal(gang_topology_stage_layers(t, s, &first, &count), 0);
        assert_int_equal(first, next);
        assert_true(count >= 1);
        /* The documented rule: the first n_layers % pp stages get one extra layer. */
        assert_int_equal(count, base + (s < extra ? 1u : 0u));
        next = first + count;
    }
    assert_int_equal(next, t->n_layers);
}

/* Checks that the TP shards partition heads, ffn and vocab and that GQA reads stay local. */
static void check_tp_shards(const gang_topology *t)
{
    uint32_t next_head = 0, next_ffn = 0, next_vocab = 0;
    uint32_t group = t->n_heads / t->n_kv_heads; /* query heads per kv head */
    uint32_t kv_holders[64];

    assert_true(t->n_kv_heads <= 64);
    memset(kv_holders, 0, sizeof(kv_holders));
    for (uint32_t r = 0; r < t->tp; r++) {
        gang_tp_shard s;

        assert_int_equal(gang_topology_tp_shard(t, r, &s), 0);
        assert_int_equal(s.tp_rank, r);
        assert_int_equal(s.head_first, next_head);
        assert_int_equal(s.head_count, t->n_heads / t->tp);
        next_head += s.head_count;
        assert_int_equal(s.ffn_first, next_ffn);
        assert_int_equal(s.ffn_count, t->ffn / t->tp);
        next_ffn += s.ffn_count;
        assert_int_equal(s.vocab_first, next_vocab);
        assert_true(s.vocab_count >= t->vocab / t->tp && s.vocab_count <= t->vocab / t->tp + 1);
        next_vocab += s.vocab_count;

        assert_true(s.kv_head_count >= 1);
        assert_true(s.kv_head_first + s.kv_head_count <= t->n_kv_heads);
        if (t->tp > t->n_kv_heads) {
            assert_int_equal(s.kv_head_count, 1);
            assert_int_equal(s.kv_replicas, t->tp / t->n_kv_heads);
            assert_int_equal(s.kv_head_first, r / (t->tp / t->n_kv_heads));
        } else {
            assert_int_equal(s.kv_replicas, 1);
            assert_int_equal(s.kv_head_count, t->n_kv_heads / t->tp);
            assert_int_equal(s.kv_head_first, r * (t->n_kv_heads / t->tp));
        }
        for (uint32_t k = s.kv_head_first; k < s.kv_head_first + s.kv_head_count; k++)
            kv_holders[k]++;
        /* Every local query head reads a kv head this rank holds. */
        for (uint32_t h = s.head_first; h < s.head_first + s.head_count; h++) {
            assert_true(h / group >= s.kv_head_first);
            assert_true(h / group < s.kv_head_first + s.kv_head_count);
        }
    }
    assert_int_equal(next_head, t->n_heads);
    assert_int_equal(next_ffn, t->ffn);
    assert_int_equal(next_vocab, t->vocab);
    /* Every kv head is held, and by exactly kv_replicas ranks. */
    for (uint32_t k = 0; k < t->n_kv_heads; k++)
        assert_int_equal(kv_holders[k], t->kv_replicas);
}

/*
 * Every TP in {1,2,4,8} x PP in {1,2,3} x every node shape of the world: shapes with
 * whole TP groups per node are accepted, the others refused unless cross-node TP is
 * allowed; every accepted layout passes the placement, layer and shard checks.
 */
static void test_exhaustive_layouts(void **state)
{
    unsigned accepted = 0, refused = 0;

    (void)state;
    for (size_t i = 0; i < sizeof(tp_values) / sizeof(tp_values[0]); i++) {
        for (size_t j = 0; j < sizeof(pp_values) / sizeof(pp_values[0]); j++) {
            uint32_t tp = tp_values[i], pp = pp_values[j], world = tp * pp;

            for (size_t k = 0; k < sizeof(nproc_values) / sizeof(nproc_values[0]); k++) {
                uint32_t nproc = nproc_values[k];
                int whole = nproc % tp == 0;

                if (nproc > world || world % nproc != 0)
                    continue;
                for (size_t l = 0; l < sizeof(layer_values) / sizeof(layer_values[0]); l++) {
                    for (int allow = 0; allow <= 1; allow++) {
                        gang_topology_config c = base_config();
                        gang_topology t;
                        char err[256];
                        int rc;

                        c.nnodes = (int32_t)(world / nproc);
                        c.nproc_per_node = (int32_t)nproc;
                        c.tp = (int32_t)tp;
                        c.pp = (int32_t)pp;
                        c.n_layers = (int32_t)layer_values[l];
                        c.allow_cross_node_tp = allow;
                        rc = gang_topology_init(&c, &t, err, sizeof(err));
                        if (!whole && !allow) {
                            assert_int_equal(rc, GANG_EUSAGE);
                            assert_non_null(strstr(err, "span nodes"));
                            refused++;
                            continue;
                        }
                        assert_int_equal(rc, 0);
                        assert_string_equal(err, "");
                        assert_int_equal(t.world_size, world);
                        assert_int_equal(t.tp_cross_node, whole ? 0 : 1);
                        check_ranks(&t);
                        check_stage_layers(&t);
                        check_tp_shards(&t);
                        accepted++;
                    }
                }
            }
        }
    }
    /* Guard against a loop that silently checks nothing. */
    assert_true(accepted > 100);
    assert_true(refused > 10);
}

/* Every kv head count that tp either divides or is a multiple of: split and replication. */
static void test_kv_heads_split_and_replicated(void **state)
{
    unsigned replicated = 0, split = 0;

    (void)state;
    for (size_t i = 0; i < sizeof(tp_values) / sizeof(tp_values[0]); i++) {
        for (size_t k = 0; k < sizeof(kv_values) / sizeof(kv_values[0]); k++) {
            gang_topology_config c = base_config();
            gang_topology t;
            char err[256];

            c.tp = (int32_t)tp_values[i];
            c.pp = 1;
            c.nnodes = 1;
            c.nproc_per_node = c.tp;
            c.n_kv_heads = (int32_t)kv_values[k];
            assert_int_equal(gang_topology_init(&c, &t, err, sizeof(err)), 0);
            check_tp_shards(&t);
            if (t.kv_replicas > 1)
                replicated++;
            else
                split++;
        }
    }
    assert_true(replicated > 0 && split > 0);
}

/* Concrete spot values, so that a wrong formula cannot hide behind a self-consistent one. */
static void test_known_values(void **state)
{
    gang_topology_config c = base_config();
    gang_topology t;
    gang_rank_place p;
    gang_tp_shard s;
    uint32_t first, count;

    (void)state;
    /* 2 nodes x 4, tp = 4, pp = 2, 7 layers: stage 0 = [0, 4), stage 1 = [4, 7). */
    assert_int_equal(gang_topology_init(&c, &t, NULL, 0), 0);
    assert_int_equal(t.head_dim, 128);
    assert_int_equal(gang_topology_rank(&t, 6, &p), 0);
    assert_int_equal(p.node, 1);
    assert_int_equal(p.local_rank, 2);
    assert_int_equal(p.pp_stage, 1);
    assert_int_equal(p.tp_rank, 2);
    assert_int_equal(p.tp_group_first_rank, 4);
    assert_int_equal(p.pp_prev_rank, 2);
    assert_int_equal(p.pp_next_rank, -1);
    assert_int_equal(gang_topology_stage_layers(&t, 0, &first, &count), 0);
    assert_int_equal(first, 0);
    assert_int_equal(count, 4);
    assert_int_equal(gang_topology_stage_layers(&t, 1, &first, &count), 0);
    assert_int_equal(first, 4);
    assert_int_equal(count, 3);
    assert_int_equal(gang_topology_tp_shard(&t, 3, &s), 0);
    assert_int_equal(s.head_first, 24);
    assert_int_equal(s.head_count, 8);
    assert_int_equal(s.kv_head_first, 6);
    assert_int_equal(s.kv_head_count, 2);
    assert_int_equal(s.ffn_first, 8256);
    assert_int_equal(s.ffn_count, 2752);
    /* 32001 = 4 x 8000 + 1: rank 0 holds 8001 entries, rank 3 starts at 24001. */
    assert_int_equal(s.vocab_first, 24001);
    assert_int_equal(s.vocab_count, 8000);

    /* 8 layers over 3 stages: 3, 3, 2. */
    c.nnodes = 3;
    c.pp = 3;
    c.n_layers = 8;
    assert_int_equal(gang_topology_init(&c, &t, NULL, 0), 0);
    assert_int_equal(gang_topology_stage_layers(&t, 1, &first, &count), 0);
    assert_int_equal(first, 3);
    assert_int_equal(count, 3);
    assert_int_equal(gang_topology_stage_layers(&t, 2, &first, &count), 0);
    assert_int_equal(first, 6);
    assert_int_equal(count, 2);

    /* tp = 8 over 2 kv heads: ranks 0-3 hold kv head 0, ranks 4-7 kv head 1. */
    c = base_config();
    c.nnodes = 1;
    c.nproc_per_node = 8;
    c.tp = 8;
    c.pp = 1;
    c.n_kv_heads = 2;
    assert_int_equal(gang_topology_init(&c, &t, NULL, 0), 0);
    assert_int_equal(t.kv_replicas, 4);
    assert_int_equal(gang_topology_tp_shard(&t, 3, &s), 0);
    assert_int_equal(s.kv_head_first, 0);
    assert_int_equal(gang_topology_tp_shard(&t, 4, &s), 0);
    assert_int_equal(s.kv_head_first, 1);
    assert_int_equal(s.kv_head_count, 1);
    assert_int_equal(s.kv_replicas, 4);
}

/* One field override of a refusal case. */
typedef struct field_set {
    size_t offset; /* offsetof the int32_t field in gang_topology_config */
    int32_t value; /* the value to put there */
} field_set;

/* One refusal case: up to three fields to set on the base config and the message part. */
typedef struct refusal_case {
    const char *what;   /* description printed on failure */
    size_t nset;        /* used entries of set */
    field_set set[3];   /* the perturbation */
    const char *expect; /* fragment the error message must contain */
} refusal_case;

/* One case per line reads better than clang-format's layout of this table. */
/* clang-format off */
#define CFG_OFF(field) offsetof(gang_topology_config, field)
#define SET(field, v) {CFG_OFF(field), (v)}

static const refusal_case refusals[] = {
    /* tp x pp != world: tp 4 x pp 2 = 8 on 3 nodes x 4. */
    {"world mismatch", 1, {SET(nnodes, 3)}, "does not equal the world size"},
    /* tp does not divide n_heads (30 heads over tp 4); kv 6 keeps the GQA check happy. */
    {"heads not divisible", 2, {SET(n_heads, 30), SET(n_kv_heads, 6)},
     "tp (4) does not divide n_heads (30)"},
    /* tp does not divide ffn. */
    {"ffn not divisible", 1, {SET(ffn, 11010)}, "tp (4) does not divide ffn (11010)"},
    /* tp = 4 vs 6 kv heads (48 q heads): 6 % 4 != 0 and 4 % 6 != 0. */
    {"kv heads neither", 2, {SET(n_kv_heads, 6), SET(n_heads, 48)},
     "neither divides n_kv_heads (6)"},
    /* tp = 4 > 3 kv heads (24 q heads): 4 % 3 != 0, so replication is uneven. */
    {"kv heads replicated unevenly", 2, {SET(n_kv_heads, 3), SET(n_heads, 24)},
     "neither divides n_kv_heads (3)"},
    /* TP group across nodes: tp 4 on nodes of 2 (4 nodes x 2 = 8 = 4 x 2). */
    {"tp > nproc_per_node", 2, {SET(nproc_per_node, 2), SET(nnodes, 4)}, "span nodes"},
    /* TP group across nodes: tp 4 x pp 3 = 12 on 2 nodes of 6 (6 % 4 != 0). */
    {"nproc_per_node % tp", 3, {SET(nproc_per_node, 6), SET(nnodes, 2), SET(pp, 3)},
     "span nodes"},
    /* pp > n_layers. */
    {"pp > n_layers", 1, {SET(n_layers, 1)}, "pp (2) exceeds n_layers (1)"},
    /* n_heads % n_kv_heads != 0 (32 heads, 12 kv heads). */
    {"gqa group", 1, {SET(n_kv_heads, 12)}, "n_heads (32) is not divisible by n_kv_heads (12)"},
    /* hidden not a multiple of n_heads. */
    {"head_dim", 1, {SET(hidden, 4100)}, "head_dim"},
    /* vocab too small to give every TP rank a column. */
    {"vocab < tp", 1, {SET(vocab, 3)}, "vocab (3)"},
    /* Zero and negative values, one field at a time. */
    {"nnodes 0", 1, {SET(nnodes, 0)}, "nnodes must be positive"},
    {"nproc -1", 1, {SET(nproc_per_node, -1)}, "nproc_per_node must be positive"},
    {"tp 0", 1, {SET(tp, 0)}, "tp must be positive"},
    {"pp -2", 1, {SET(pp, -2)}, "pp must be positive"},
    {"n_layers 0", 1, {SET(n_layers, 0)}, "n_layers must be positive"},
    {"n_heads 0", 1, {SET(n_heads, 0)}, "n_heads must be positive"},
    {"n_kv_heads 0", 1, {SET(n_kv_heads, 0)}, "n_kv_heads must be positive"},
    {"ffn -1", 1, {SET(ffn, -1)}, "ffn must be positive"},
    {"hidden 0", 1, {SET(hidden, 0)}, "hidden must be positive"},
    {"vocab -5", 1, {SET(vocab, -5)}, "vocab must be positive"},
    {"allow 2", 1, {SET(allow_cross_node_tp, 2)}, "allow_cross_node_tp must be 0 or 1"},
    /* An EP group wider than TP must hold whole TP groups, and the world is ep x pp. */
    {"ep 6 over tp 4", 2, {SET(ep, 6), SET(nproc_per_node, 6)}, "ep (6) is neither"},
    {"ep -1", 1, {SET(ep, -1)}, "ep must not be negative"},
    {"ep 8 x pp 2 on 8 ranks", 1, {SET(ep, 8)}, "ep (8) x pp (2) = 16"},
    /* A world beyond the cap is refused before any multiplication can overflow. */
    {"huge world", 1, {SET(nnodes, 2000000000)}, "exceeds the limit"},
};
/* clang-format on */

/* Stores value into the int32_t field of c at offset. */
static void set_field(gang_topology_config *c, size_t offset, int32_t value)
{
    memcpy((char *)c + offset, &value, sizeof(value));
}

/* Every refusal returns GANG_EUSAGE, names the problem and leaves *t untouched. */
static void test_refusals(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(refusals) / sizeof(refusals[0]); i++) {
        const refusal_case *rc = &refusals[i];
        gang_topology_config c = base_config();
        gang_topology t, before;
        char err[256];
        int ret;

        for (size_t k = 0; k < rc->nset; k++)
            set_field(&c, rc->set[k].offset, rc->set[k].value);
        memset(&t, 0xa5, sizeof(t));
        before = t;
        ret = gang_topology_init(&c, &t, err, sizeof(err));
        if (ret != GANG_EUSAGE || strstr(err, rc->expect) == NULL)
            print_error("case '%s': rc %d, err '%s', expected '%s'\n", rc->what, ret, err,
                        rc->expect);
        assert_int_equal(ret, GANG_EUSAGE);
        assert_non_null(strstr(err, rc->expect));
        assert_memory_equal(&t, &before, sizeof(t));
    }
}

/* The refusal cases are refusals of the perturbation only: the base layout is valid. */
static void test_base_is_valid(void **state)
{
    gang_topology_config c = base_config();
    gang_topology t;
    char err[256];

    (void)state;
    assert_int_equal(gang_topology_init(&c, &t, err, sizeof(err)), 0);
    /* Cross-node TP that is explicitly allowed: tp 4 on nodes of 2. */
    c.nnodes = 4;
    c.nproc_per_node = 2;
    assert_int_equal(gang_topology_init(&c, &t, err, sizeof(err)), GANG_EUSAGE);
    c.allow_cross_node_tp = 1;
    assert_int_equal(gang_topology_init(&c, &t, err, sizeof(err)), 0);
    assert_int_equal(t.tp_cross_node, 1);
    /* tp 4 x pp 3 on 2 nodes of 6: the sizes match but a TP group would straddle. */
    c = base_config();
    c.nnodes = 2;
    c.nproc_per_node = 6;
    c.tp = 4;
    c.pp = 3;
    c.n_heads = 32;
    assert_int_equal(gang_topology_init(&c, &t, err, sizeof(err)), GANG_EUSAGE);
    assert_non_null(strstr(err, "span nodes"));
    assert_non_null(strstr(err, "nproc_per_node (6)"));
    /* A tiny err buffer is still NUL-terminated and the code is unchanged. */
    char small[8];
    assert_int_equal(gang_topology_init(&c, &t, small, sizeof(small)), GANG_EUSAGE);
    assert_true(strlen(small) < sizeof(small));
}

/*
 * Expert parallelism wider than TP (ep = k x tp, k > 1): a stage is ep consecutive ranks
 * holding k TP groups. Every rank's (pp, ep, tp) place and its three groups, checked
 * against the numbering of parallel.h on every (ep, tp, pp) of the issue and a few more,
 * with the groups the worker splits (TP by its first rank, PP by ep_rank, EP by stage)
 * counted here from the places: each must have exactly tp, pp and ep members.
 */
static void test_ep_wider_than_tp(void **state)
{
    /* (ep, tp, pp) */
    static const uint32_t shapes[][3] = {{2, 1, 1}, {4, 1, 1}, {2, 1, 2}, {4, 2, 1},
                                         {4, 2, 2}, {6, 2, 3}, {8, 4, 1}};
    (void)state;
    for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
        uint32_t ep = shapes[i][0], tp = shapes[i][1], pp = shapes[i][2];
        gang_topology_config c = base_config();
        gang_topology t;
        char err[256];
        uint32_t tp_members[64] = {0}, pp_members[64] = {0}, ep_members[64] = {0};

        c.nnodes = (int32_t)pp;
        c.nproc_per_node = (int32_t)ep;
        c.tp = (int32_t)tp;
        c.pp = (int32_t)pp;
        c.ep = (int32_t)ep;
        c.n_layers = 6;
        assert_int_equal(gang_topology_init(&c, &t, err, sizeof(err)), 0);
        assert_int_equal(t.world_size, ep * pp);
        assert_int_equal(t.stage_ranks, ep);
        assert_int_equal(t.tp_replicas, ep / tp);
        assert_int_equal(t.tp, tp);
        for (uint32_t r = 0; r < t.world_size; r++) {
            gang_rank_place p;
            uint32_t back = UINT32_MAX;

            assert_int_equal(gang_topology_rank(&t, r, &p), 0);
            assert_int_equal(p.pp_stage, r / ep);
            assert_int_equal(p.ep_rank, r % ep);
            assert_int_equal(p.tp_replica, (r % ep) / tp);
            assert_int_equal(p.tp_rank, r % tp);
            assert_int_equal(p.tp_replica * tp + p.tp_rank, p.ep_rank);
            assert_int_equal(p.stage_first_rank, p.pp_stage * ep);
            assert_int_equal(p.tp_group_first_rank, r - p.tp_rank);
            assert_int_equal(p.pp_prev_rank, p.pp_stage == 0 ? -1 : (int32_t)(r - ep));
            assert_int_equal(p.pp_next_rank, p.pp_stage + 1 == pp ? -1 : (int32_t)(r + ep));
            /* rank_at names the stage's first TP group (replica 0). */
            assert_int_equal(gang_topology_rank_at(&t, p.pp_stage, p.tp_rank, &back), 0);
            assert_int_equal(back, p.stage_first_rank + p.tp_rank);
            tp_members[p.tp_group_first_rank]++;
            pp_members[p.ep_rank]++;
            ep_members[p.pp_stage]++;
        }
        for (uint32_t g = 0; g < t.world_size; g++) {
            assert_int_equal(tp_members[g], g % tp == 0 ? tp : 0);
            assert_int_equal(pp_members[g], g < ep ? pp : 0);
            assert_int_equal(ep_members[g], g < pp ? ep : 0);
        }
    }
    /* Known values, 2x1x2 (ep 2, tp 1, pp 2): rank 3 is stage 1, ep rank 1, replica 1. */
    {
        gang_topology_config c = base_config();
        gang_topology t;
        gang_rank_place p;

        c.nnodes = 2;
        c.nproc_per_node = 2;
        c.tp = 1;
        c.ep = 2;
        assert_int_equal(gang_topology_init(&c, &t, NULL, 0), 0);
        assert_int_equal(gang_topology_rank(&t, 3, &p), 0);
        assert_int_equal(p.pp_stage, 1);
        assert_int_equal(p.ep_rank, 1);
        assert_int_equal(p.tp_replica, 1);
        assert_int_equal(p.tp_rank, 0);
        assert_int_equal(p.pp_prev_rank, 1);
        assert_int_equal(p.pp_next_rank, -1);
    }
    /* ep at most tp changes nothing: a stage is the TP group (ep 1, ep = tp, ep 2 < 4). */
    for (int32_t ep = 0; ep <= 4; ep++) {
        gang_topology_config c = base_config();
        gang_topology t;
        gang_rank_place p;

        c.ep = ep;
        assert_int_equal(gang_topology_init(&c, &t, NULL, 0), 0);
        assert_int_equal(t.stage_ranks, 4);
        assert_int_equal(t.tp_replicas, 1);
        assert_int_equal(gang_topology_rank(&t, 6, &p), 0);
        assert_int_equal(p.ep_rank, p.tp_rank);
        assert_int_equal(p.tp_replica, 0);
        assert_int_equal(p.pp_stage, 1);
    }
}

/* Bad pointers and out-of-range queries are GANG_EINVAL, never a crash. */
static void test_invalid_arguments(void **state)
{
    gang_topology_config c = base_config();
    gang_topology t;
    gang_rank_place p;
    gang_tp_shard s;
    uint32_t a, b;
    char err[64];

    (void)state;
    assert_int_equal(gang_topology_init(NULL, &t, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_topology_init(&c, NULL, err, sizeof(err)), GANG_EINVAL);
    assert_int_equal(gang_topology_init(&c, &t, NULL, 0), 0);
    assert_int_equal(gang_topology_rank(&t, t.world_size, &p), GANG_EINVAL);
    assert_int_equal(gang_topology_rank(NULL, 0, &p), GANG_EINVAL);
    assert_int_equal(gang_topology_rank(&t, 0, NULL), GANG_EINVAL);
    assert_int_equal(gang_topology_rank_at(&t, t.pp, 0, &a), GANG_EINVAL);
    assert_int_equal(gang_topology_rank_at(&t, 0, t.tp, &a), GANG_EINVAL);
    assert_int_equal(gang_topology_rank_at(&t, 0, 0, NULL), GANG_EINVAL);
    assert_int_equal(gang_topology_stage_layers(&t, t.pp, &a, &b), GANG_EINVAL);
    assert_int_equal(gang_topology_stage_layers(&t, 0, NULL, &b), GANG_EINVAL);
    assert_int_equal(gang_topology_stage_layers(&t, 0, &a, NULL), GANG_EINVAL);
    assert_int_equal(gang_topology_tp_shard(&t, t.tp, &s), GANG_EINVAL);
    assert_int_equal(gang_topology_tp_shard(&t, 0, NULL), GANG_EINVAL);
    assert_int_equal(gang_topology_tp_shard(NULL, 0, &s), GANG_EINVAL);
}

#if GANG_HAVE_MPI
/* 1 when a mapping of this process's address space names a file containing what. */
static int self_maps(const char *what)
{
    char line[1024];
    int found = 0;
    FILE *f = fopen("/proc/self/maps", "r");

    assert_non_null(f);
    while (!found && fgets(line, sizeof(line), f) != NULL)
        found = strstr(line, what) != NULL;
    fclose(f);
    return found;
}
#endif

/*
 * The mpi backend is a module (parallel/comm-mpi-load.c): Open MPI is not mapped until the
 * module is loaded; a missing module, or a library without the vtable, is GANG_ENOENT; the
 * real one gives the "mpi" vtable and brings libmpi in. Runs first (see main).
 */
static void test_mpi_module(void **state)
{
    (void)state;
#if !GANG_HAVE_MPI
    assert_false(gang_comm_backend_built(GANG_COMM_MPI));
    print_message("mpi backend not built (no MPI at configure time): no module to load\n");
    skip();
#else
    const gang__comm_ops *ops = NULL;

    assert_true(gang_comm_backend_built(GANG_COMM_MPI));
    assert_false(self_maps("libmpi.so"));
    assert_int_equal(gang__comm_mpi_plugin_open("/nonexistent/" GANG_MPI_PLUGIN_NAME, &ops),
                     GANG_ENOENT);
    assert_null(ops);
    assert_int_equal(gang__comm_mpi_plugin_open("libm.so.6", &ops), GANG_ENOENT);
    assert_null(ops);
    assert_false(self_maps("libmpi.so"));
    ops = gang__comm_mpi_plugin();
    assert_non_null(ops);
    assert_string_equal(ops->name, "mpi");
    assert_non_null(ops->init);
    assert_true(self_maps("libmpi.so"));
#endif
}

int gang_test_moe(void);    /* test-moe.c */
int gang_test_tp_moe(void); /* test-tp-moe.c */

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mpi_module),
        cmocka_unit_test(test_exhaustive_layouts),
        cmocka_unit_test(test_kv_heads_split_and_replicated),
        cmocka_unit_test(test_known_values),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_ep_wider_than_tp),
        cmocka_unit_test(test_base_is_valid),
        cmocka_unit_test(test_invalid_arguments),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);

    failed += gang_test_moe();
    failed += gang_test_tp_moe();
    return failed ? 1 : 0;
}
