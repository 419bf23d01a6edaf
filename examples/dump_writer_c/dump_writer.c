/*
 * dump_writer: a tensor-dump writer for gguf-parity in plain C (C99, no libraries), to show that the dump contract
 * (docs/PLUGGING_IN.md, "Tensor dumps") needs nothing from Python.
 *
 *   cc -O2 -o dump_writer dump_writer.c -lm
 *   bench-compare validate --model tiny.gguf --engine 'cmd:./dump_writer {request} {out}'
 *
 * It reads the harness's request.json (model path, model sha256, token ids), parses the GGUF itself (header,
 * key-values, tensor infos; an F32 llama-style model), computes two of llama.cpp's graph tensors for the ids and
 * writes them to OUT/tensors.safetensors with OUT/manifest.json:
 *
 *   embd         the token embedding rows, (n_tokens, n_embd)
 *   attn_norm-0  layer 0's RMS norm times blk.0.attn_norm.weight, as ggml computes it (sum of squares in double,
 *                scale = 1.0f / sqrtf(mean + eps) in float)
 *
 * Everything else the request lists is simply not written; validation reports it as not provided.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void die(const char *what, const char *detail) {
    fprintf(stderr, "dump_writer: %s%s%s\n", what, detail ? ": " : "", detail ? detail : "");
    exit(1);
}

static char *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) die("cannot open", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) die("cannot read", path);
    buf[n] = 0;
    fclose(f);
    if (size) *size = (size_t)n;
    return buf;
}

/* --- just enough JSON: the string after "key": and the integer array after "key": ------------------------- */
static const char *json_find(const char *json, const char *key) {
    char pattern[128];
    snprintf(pattern, sizeof pattern, "\"%s\"", key);
    const char *p = strstr(json, pattern);
    if (!p) return NULL;
    p = strchr(p + strlen(pattern), ':');
    if (!p) return NULL;
    p++;
    while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
    return p;
}

static char *json_string(const char *json, const char *key) {
    const char *p = json_find(json, key);
    if (!p || *p != '"') die("request has no string field", key);
    p++;
    char *out = malloc(strlen(p) + 1), *o = out;
    for (; *p && *p != '"'; p++) {
        if (*p == '\\') {
            p++;
            if (*p == 'n') *o++ = '\n';
            else if (*p == 't') *o++ = '\t';
            else *o++ = *p; /* \\ \" \/ */
        } else {
            *o++ = *p;
        }
    }
    *o = 0;
    return out;
}

static int64_t *json_int_array(const char *json, const char *key, size_t *n) {
    const char *p = json_find(json, key);
    if (!p || *p != '[') die("request has no array field", key);
    size_t cap = 64, count = 0;
    int64_t *out = malloc(cap * sizeof *out);
    p++;
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t' || *p == ',') p++;
        if (*p == ']') break;
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p) die("bad number in", key);
        if (count == cap) out = realloc(out, (cap *= 2) * sizeof *out);
        out[count++] = v;
        p = end;
    }
    *n = count;
    return out;
}

/* --- GGUF: header, key-values, tensor infos (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md) ----- */
enum { T_U8, T_I8, T_U16, T_I16, T_U32, T_I32, T_F32, T_BOOL, T_STRING, T_ARRAY, T_U64, T_I64, T_F64 };
static const size_t SCALAR_SIZE[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

typedef struct { const uint8_t *p, *end; } cursor;

static const uint8_t *take(cursor *c, size_t n) {
    if ((size_t)(c->end - c->p) < n) die("GGUF file is truncated", NULL);
    const uint8_t *at = c->p;
    c->p += n;
    return at;
}
static uint32_t u32(cursor *c) { uint32_t v; memcpy(&v, take(c, 4), 4); return v; }
static uint64_t u64(cursor *c) { uint64_t v; memcpy(&v, take(c, 8), 8); return v; }
static void skip_value(cursor *c, uint32_t type) {
    if (type == T_STRING) { take(c, u64(c)); return; }
    if (type == T_ARRAY) {
        uint32_t et = u32(c);
        uint64_t n = u64(c);
        for (uint64_t i = 0; i < n; i++) skip_value(c, et);
        return;
    }
    if (type > T_F64) die("unknown GGUF value type", NULL);
    take(c, SCALAR_SIZE[type]);
}
static int key_is(const uint8_t *s, uint64_t n, const char *suffix) {
    size_t m = strlen(suffix);
    return n >= m && memcmp(s + n - m, suffix, m) == 0;
}

typedef struct { char name[96]; uint64_t ne[4]; uint32_t n_dims, type; uint64_t offset; } tensor_info;

typedef struct {
    uint64_t n_embd, alignment, n_tensors;
    float eps;
    tensor_info *tensors;
    const uint8_t *data;
} gguf_model;

static gguf_model open_gguf(const uint8_t *buf, size_t size) {
    gguf_model m = {0, 32, 0, 1e-5f, NULL, NULL};
    cursor c = {buf, buf + size};
    if (memcmp(take(&c, 4), "GGUF", 4) != 0) die("not a GGUF file", NULL);
    if (u32(&c) < 2) die("GGUF version 1 is not supported", NULL);
    m.n_tensors = u64(&c);
    uint64_t n_kv = u64(&c);
    for (uint64_t i = 0; i < n_kv; i++) {
        uint64_t klen = u64(&c);
        const uint8_t *key = take(&c, klen);
        uint32_t type = u32(&c);
        if (key_is(key, klen, ".embedding_length") && type == T_U32) m.n_embd = u32(&c);
        else if (key_is(key, klen, ".embedding_length") && type == T_U64) m.n_embd = u64(&c);
        else if (key_is(key, klen, ".attention.layer_norm_rms_epsilon") && type == T_F32) memcpy(&m.eps, take(&c, 4), 4);
        else if (klen == 17 && memcmp(key, "general.alignment", 17) == 0 && type == T_U32) m.alignment = u32(&c);
        else skip_value(&c, type);
    }
    m.tensors = calloc(m.n_tensors, sizeof *m.tensors);
    for (uint64_t i = 0; i < m.n_tensors; i++) {
        tensor_info *t = &m.tensors[i];
        uint64_t nlen = u64(&c);
        const uint8_t *name = take(&c, nlen);
        memcpy(t->name, name, nlen < sizeof t->name - 1 ? nlen : sizeof t->name - 1);
        t->n_dims = u32(&c);
        for (uint32_t d = 0; d < t->n_dims; d++) t->ne[d] = u64(&c);
        t->type = u32(&c);
        t->offset = u64(&c);
    }
    size_t header = (size_t)(c.p - buf);
    size_t start = (header + m.alignment - 1) / m.alignment * m.alignment;
    m.data = buf + start;
    return m;
}

static const float *f32_tensor(const gguf_model *m, const char *name, uint64_t *ne0, uint64_t *ne1) {
    for (uint64_t i = 0; i < m->n_tensors; i++) {
        if (strcmp(m->tensors[i].name, name) == 0) {
            if (m->tensors[i].type != 0) die("this example reads F32 models only; not F32", name);
            *ne0 = m->tensors[i].ne[0];
            *ne1 = m->tensors[i].n_dims > 1 ? m->tensors[i].ne[1] : 1;
            return (const float *)(m->data + m->tensors[i].offset);
        }
    }
    die("tensor not in the model", name);
    return NULL;
}

/* --- safetensors: 8-byte little-endian header length, JSON header (padded to 8), raw little-endian data -------- */
static void write_outputs(const char *out_dir, const char *sha, const int64_t *ids, size_t n_ids, uint64_t n_embd,
                          const float *embd, const float *norm) {
    size_t bytes = n_ids * n_embd * sizeof(float);
    char header[1024];
    int len = snprintf(header, sizeof header,
                       "{\"embd\":{\"dtype\":\"F32\",\"shape\":[%zu,%llu],\"data_offsets\":[0,%zu]},"
                       "\"attn_norm-0\":{\"dtype\":\"F32\",\"shape\":[%zu,%llu],\"data_offsets\":[%zu,%zu]}}",
                       n_ids, (unsigned long long)n_embd, bytes, n_ids, (unsigned long long)n_embd, bytes, 2 * bytes);
    while (len % 8) header[len++] = ' ';
    char path[4096];
    snprintf(path, sizeof path, "%s/tensors.safetensors", out_dir);
    FILE *f = fopen(path, "wb");
    if (!f) die("cannot write", path);
    uint64_t hlen = (uint64_t)len; /* little-endian hosts (x86-64, arm64) */
    fwrite(&hlen, 8, 1, f);
    fwrite(header, 1, (size_t)len, f);
    fwrite(embd, 1, bytes, f);
    fwrite(norm, 1, bytes, f);
    if (fclose(f) != 0) die("cannot write", path);

    snprintf(path, sizeof path, "%s/manifest.json", out_dir);
    f = fopen(path, "w");
    if (!f) die("cannot write", path);
    fprintf(f, "{\"format\": \"gguf-parity.dump\", \"version\": 1, \"model_sha256\": \"%s\", \"token_ids\": [", sha);
    for (size_t i = 0; i < n_ids; i++) fprintf(f, "%s%lld", i ? ", " : "", (long long)ids[i]);
    fprintf(f, "], \"engine\": {\"name\": \"dump_writer_c\", \"version\": \"1\"}, "
               "\"tensors\": {\"embd\": {\"dtype\": \"F32\"}, \"attn_norm-0\": {\"dtype\": \"F32\"}}}\n");
    if (fclose(f) != 0) die("cannot write", path);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: dump_writer REQUEST.json OUT_DIR\n");
        return 2;
    }
    char *request = read_file(argv[1], NULL);
    char *model_path = json_string(request, "path");
    char *sha = json_string(request, "sha256");
    size_t n_ids;
    int64_t *ids = json_int_array(request, "token_ids", &n_ids);

    size_t size;
    uint8_t *buf = (uint8_t *)read_file(model_path, &size);
    gguf_model m = open_gguf(buf, size);
    uint64_t ne0, ne1, w0, w1;
    const float *token_embd = f32_tensor(&m, "token_embd.weight", &ne0, &ne1);
    const float *norm_w = f32_tensor(&m, "blk.0.attn_norm.weight", &w0, &w1);
    if (ne0 != m.n_embd || w0 != m.n_embd) die("tensor sizes disagree with embedding_length", NULL);

    float *embd = malloc(n_ids * ne0 * sizeof(float)), *norm = malloc(n_ids * ne0 * sizeof(float));
    for (size_t t = 0; t < n_ids; t++) {
        if (ids[t] < 0 || (uint64_t)ids[t] >= ne1) die("token id out of range", NULL);
        const float *row = token_embd + (uint64_t)ids[t] * ne0;
        float *e = embd + t * ne0, *y = norm + t * ne0;
        double sum = 0.0;
        for (uint64_t i = 0; i < ne0; i++) {
            e[i] = row[i];
            sum += (double)(row[i] * row[i]);
        }
        const float mean = (float)(sum / (double)ne0);
        const float scale = 1.0f / sqrtf(mean + m.eps);
        for (uint64_t i = 0; i < ne0; i++) y[i] = (row[i] * scale) * norm_w[i];
    }
    write_outputs(argv[2], sha, ids, n_ids, ne0, embd, norm);
    return 0;
}
