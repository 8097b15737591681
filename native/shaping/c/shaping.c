/* exactedit sampler-side shaping, reference implementation (see shaping.h, docs/shaping.md).
 * Mirrors solvers/shaping/triggers.py (TriggerMachine), solvers/shaping/rules.py (rules) and the
 * shared phrase matcher's walk (solvers/phrases.py); tests/native/shaping/test_shaping_c.py and
 * tests/test_fence_split.py check it bit for bit.
 * Build: cc -std=c99 -O2 -ffp-contract=off -shared -fPIC shaping.c -lm */
#include "shaping.h"

#include <math.h>
#include <string.h>

typedef struct {
    int chat, in_header, body, assistant, think, tool, first_seen, structured;
    int64_t header_len;
    int header_ok;
    int64_t fences, span;         /* fences: markers of the fenced text so far */
    int run;                      /* its trailing backtick run, capped at ES_FENCE_RUN */
    int32_t prev;
} es_machine;

typedef struct {
    int generating, in_think, in_tool, in_code, structured, step0, reply_start, sentence_start, boundary;
    int64_t span;
} es_row;

static int in_list(const int32_t *ids, int32_t n, int32_t tok) {
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == tok) return 1;
    return 0;
}

static void machine_reset(es_machine *m) {
    memset(m, 0, sizeof *m);
    m->header_ok = 1;
    m->span = -1;
    m->prev = -1;
}

/* solvers.shaping.triggers.fence_step: count a run the moment it reaches ES_FENCE_RUN backticks */
static void fence_step(es_machine *m, uint8_t f, const uint8_t *fence) {
    int lead = fence[0], inner = fence[1], trail = fence[2];
    if (f & ES_TICKS) {
        int grown = m->run + lead < ES_FENCE_RUN ? m->run + lead : ES_FENCE_RUN;
        m->fences += m->run < ES_FENCE_RUN && grown >= ES_FENCE_RUN;
        m->run = grown;
    } else {
        m->fences += (m->run < ES_FENCE_RUN && m->run + lead >= ES_FENCE_RUN) + inner + (trail >= ES_FENCE_RUN);
        m->run = trail;
    }
}

/* solvers.shaping.triggers.TriggerMachine.push */
static es_row machine_push(es_machine *m, const es_vocab *v, int32_t tok) {
    uint8_t f = v->flags[tok];
    int step0 = 0, header_done = 0;
    es_row r;
    if (in_list(v->turn_start, v->n_turn_start, tok)) {
        m->chat = 1; m->in_header = 1; m->body = 0; m->assistant = 0;
        m->header_len = 0; m->header_ok = 1;
        m->think = m->tool = m->first_seen = m->structured = 0;
        m->fences = 0; m->run = 0;
    } else if (m->in_header) {
        int ends = v->header_end >= 0 ? tok == v->header_end : (f & ES_NEWLINE) != 0;
        if (ends) {
            m->in_header = 0; m->body = 1;
            m->assistant = m->header_ok && m->header_len == v->n_role
                           && (v->header_end >= 0 || (f & ES_NL_LEAD) != 0);
            header_done = m->assistant;
            step0 = header_done && v->think_close < 0;
        } else {
            if (!(m->header_len < v->n_role && v->role[m->header_len] == tok)) m->header_ok = 0;
            m->header_len++;
        }
    } else if (in_list(v->turn_end, v->n_turn_end, tok)) {
        m->body = 0; m->run = 0;
    } else if (m->body || !m->chat) {             /* a chat tag ends a backtick run (run = 0) */
        if (v->think_open >= 0 && tok == v->think_open) {
            m->think = 1; m->run = 0;
        } else if (v->think_close >= 0 && tok == v->think_close) {
            m->think = 0; m->first_seen = 0; m->run = 0;
        } else if (v->tool_open >= 0 && tok == v->tool_open) {
            m->tool = 1; m->run = 0;
            if (!m->first_seen && !m->think) m->first_seen = m->structured = 1;
        } else if (v->tool_close >= 0 && tok == v->tool_close) {
            m->tool = 0; m->run = 0;
        } else if (!m->think) {
            if (v->think_close >= 0 && m->prev == v->think_close && (f & ES_BLANK)) {
                step0 = m->assistant || !m->chat;
            } else if (!m->first_seen && (f & ES_VISIBLE)) {
                m->first_seen = 1;
                m->structured = (f & ES_STRUCTURED) != 0;
            }
            if (!m->tool) fence_step(m, f, v->fences + (size_t)3 * (size_t)tok);
        }
    }
    r.generating = (m->body && m->assistant) || !m->chat;
    m->span = !r.generating ? -1 : header_done ? 0 : m->span + 1;
    m->prev = tok;
    r.in_think = m->think;
    r.in_tool = m->tool;
    r.in_code = m->fences % 2 == 1;
    r.structured = m->structured;
    r.step0 = step0 && r.generating;
    r.reply_start = (step0 || header_done) && r.generating;
    r.sentence_start = r.generating && (f & ES_SENTENCE_END) != 0;
    r.span = m->span;
    r.boundary = (f & ES_BOUNDARY) != 0;
    return r;
}

static int open_text(const es_row *r) {
    return r->generating && !(r->in_think || r->in_tool || r->in_code || r->structured);
}

/* index of `tok` among the pieces (ascending ids), or -1 */
static int32_t piece_of(const es_penalty *p, int32_t tok) {
    int32_t lo = 0, hi = p->n_pieces - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (p->piece_id[mid] == tok) return mid;
        if (p->piece_id[mid] < tok) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

static int merge_ok(const es_penalty *p, int32_t tok, int32_t k) {
    for (int32_t i = 0; i < p->n_merge; i++)
        if (p->merge_id[i] == tok && p->merge_k[i] == k) return 1;
    return 0;
}

/* PhraseMatcher.walk: do the tokens ending at row t spell `pre` (len n), starting at a word
 * boundary, all at rows >= first? */
static int walk(const es_penalty *p, const es_vocab *v, const int32_t *h, int64_t t, int64_t first,
                const uint8_t *pre, int32_t n) {
    int64_t i = t;
    int32_t rem = n;
    while (rem > 0) {
        int32_t k, len;
        const uint8_t *b;
        if (i < first) return 0;
        k = piece_of(p, h[i]);
        if (k < 0) return 0;                       /* no byte of it can belong to a match */
        b = p->piece_bytes + p->piece_offset[k];
        len = p->piece_offset[k + 1] - p->piece_offset[k];
        if (len <= rem && memcmp(b, pre + rem - len, (size_t)len) == 0) {
            rem -= len;
            i--;
        } else if (len > rem && memcmp(b + len - rem, pre, (size_t)rem) == 0) {
            return merge_ok(p, h[i], rem);         /* merged: the match starts inside it */
        } else {
            return 0;
        }
    }
    if (i < first) return 0;                       /* bare: the token before ends a word */
    return (v->flags[h[i]] & ES_BOUNDARY) != 0;
}

/* numpy's npy_logaddexp, in double */
static double logaddexp(double x, double y) {
    if (x == y) return x + 0.693147180559945309417232121458176568;
    {
        double tmp = x - y;
        if (tmp > 0) return x + log1p(exp(-tmp));
        if (tmp <= 0) return y + log1p(exp(tmp));
        return tmp;
    }
}

int64_t es_shape(const es_rules *rules, const int32_t *history, int64_t n, float *logits) {
    const es_vocab *v;
    es_machine m;
    es_row row;
    int64_t fired = 0, t;
    if (!rules || !rules->vocab || !history || !logits || n < 1 || rules->n_rules < 0 || rules->n_rules > 63)
        return -1;
    v = rules->vocab;
    machine_reset(&m);
    for (t = 0; t < n; t++) {
        if (history[t] < 0 || history[t] >= v->n_vocab) return -1;
        row = machine_push(&m, v, history[t]);
    }
    t = n - 1;
    for (int32_t r = 0; r < rules->n_rules; r++) {
        const es_rule *rule = &rules->rules[r];
        int hit = 0;
        if (rule->kind == ES_PREFIX_PENALTY) {
            const es_penalty *p = (const es_penalty *)rule->rule;
            int64_t first = t - row.span;
            if (!open_text(&row)) continue;
            for (int32_t ph = 0; ph < p->n_phrases; ph++) {
                int match = 0;
                for (int32_t f = 0; f < p->n_prefixes && !match; f++)
                    if (p->prefix_phrase[f] == ph)
                        match = walk(p, v, history, t, first, p->prefix_bytes + p->prefix_offset[f],
                                     p->prefix_offset[f + 1] - p->prefix_offset[f]);
                if (match) {
                    logits[p->final[ph]] = logits[p->final[ph]] - p->bias;
                    hit = 1;
                }
            }
        } else if (rule->kind == ES_STEP0_GUARD) {
            const es_guard *g = (const es_guard *)rule->rule;
            if (!row.step0) continue;
            for (int32_t i = 0; i < g->n_targets; i++)
                logits[g->targets[i]] = logits[g->targets[i]] - g->bias;
            hit = g->n_targets > 0;
        } else if (rule->kind == ES_PERSONA_CASE) {
            const es_case *c = (const es_case *)rule->rule;
            if (!c->active || !open_text(&row) || !(row.reply_start || row.sentence_start)) continue;
            for (int32_t i = 0; i < c->n_pairs; i++)
                logits[c->low[i]] = (float)logaddexp((double)logits[c->low[i]], (double)logits[c->up[i]]);
            for (int32_t i = 0; i < c->n_pairs; i++)
                logits[c->up[i]] = logits[c->up[i]] - c->drop;
            hit = 1;
        } else {
            return -1;
        }
        if (hit) fired |= (int64_t)1 << r;
    }
    return fired;
}
