/* exactedit sampler-side shaping: a reference implementation of the compiled rules (JSON format
 * "exactedit.shaping", version 2; docs/shaping.md) in C99, no dependency beyond libm.
 *
 * An engine loads the JSON with its own parser into these structs (every array is owned by the
 * caller) and calls es_shape() on the logits of each step, after the engine has produced them
 * and before its sampler chain reads them. es_shape() recomputes the trigger state from the
 * document's whole token history (O(history) per call: a reference, not a fast path) and shapes
 * the logits in place exactly as exactedit's evals.shaping does, bit for bit. */
#ifndef EXACTEDIT_SHAPING_H
#define EXACTEDIT_SHAPING_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* per-token flags (the JSON's "classes"; "invisible" lists the tokens WITHOUT ES_VISIBLE) */
enum {
    ES_NEWLINE = 1,       /* text contains "\n" */
    ES_NL_LEAD = 2,       /* text starts with "\n" */
    ES_SENTENCE_END = 4,  /* text ends in . ! ? or "\n" */
    ES_BLANK = 8,         /* non-empty, only "\n" */
    ES_VISIBLE = 16,      /* not only whitespace */
    ES_STRUCTURED = 32,   /* first visible character is { [ or ` */
    ES_BOUNDARY = 64,     /* ends in a word boundary (no letter, digit, underscore) */
    ES_TICKS = 128        /* no character but backticks (or empty): a backtick run carries through it */
};

/* A code fence marker is a maximal run of >= 3 backticks in the fenced text (docs/shaping.md);
 * per token the vocab holds its leading run, the markers touching neither end and its trailing
 * run (runs capped at ES_FENCE_RUN), so a marker split over tokens counts once. */
#define ES_FENCE_RUN 3

typedef struct {
    int32_t n_vocab;
    const uint8_t *flags;         /* [n_vocab] ES_* bits */
    const uint8_t *fences;        /* [n_vocab * 3] per token: lead run, inner markers, trail run */
    const int32_t *turn_start; int32_t n_turn_start;
    const int32_t *turn_end; int32_t n_turn_end;
    const int32_t *role; int32_t n_role;   /* the assistant role's tokens */
    int32_t header_end;           /* a special token ending a turn header; -1: an ES_NEWLINE token */
    int32_t think_open, think_close, tool_open, tool_close;   /* -1 when the model has none */
} es_vocab;

typedef struct {                  /* "prefix-penalty" */
    float bias;
    int32_t n_phrases;
    const int32_t *final;         /* [n_phrases] the token each phrase's bias is subtracted from */
    int32_t n_prefixes;           /* prefix forms, all phrases together, in order */
    const int32_t *prefix_phrase; /* [n_prefixes] the phrase each form belongs to */
    const int32_t *prefix_offset; /* [n_prefixes + 1] into prefix_bytes */
    const uint8_t *prefix_bytes;
    int32_t n_pieces;             /* tokens a match can use, ids ascending */
    const int32_t *piece_id;      /* [n_pieces] */
    const int32_t *piece_offset;  /* [n_pieces + 1] into piece_bytes */
    const uint8_t *piece_bytes;
    int32_t n_merge;              /* (piece id, k) pairs, ascending by id then k */
    const int32_t *merge_id;
    const int32_t *merge_k;
} es_penalty;

typedef struct {                  /* "step0-guard" */
    float bias;
    int32_t n_targets;
    const int32_t *targets;
} es_guard;

typedef struct {                  /* "persona-case" */
    float drop;
    int32_t active;               /* the persona gate */
    int32_t n_pairs;
    const int32_t *up, *low;      /* [n_pairs] */
} es_case;

enum { ES_PREFIX_PENALTY = 1, ES_STEP0_GUARD = 2, ES_PERSONA_CASE = 3 };

typedef struct {
    int32_t kind;                 /* ES_PREFIX_PENALTY, ES_STEP0_GUARD or ES_PERSONA_CASE */
    const void *rule;             /* es_penalty, es_guard or es_case */
} es_rule;

typedef struct {
    const es_vocab *vocab;
    int32_t n_rules;              /* at most 63 */
    const es_rule *rules;         /* applied in order */
} es_rules;

/* Shape `logits` (float32 [n_vocab]) of the row that reads history[n - 1] (history: the
 * document's tokens from its first one, prompt included). Returns a bit mask of the rules that
 * fired (bit i: rules->rules[i]), or -1 when n < 1, a token lies outside the vocabulary, or a
 * rule is malformed. */
int64_t es_shape(const es_rules *rules, const int32_t *history, int64_t n, float *logits);

#ifdef __cplusplus
}
#endif
#endif
