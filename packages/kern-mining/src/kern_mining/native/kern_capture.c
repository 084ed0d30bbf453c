/*
 * kern_capture: a CUPTI injection library that records every kernel launch of a CUDA process.
 *
 * Loaded by the CUDA driver through CUDA_INJECTION64_PATH (entry point InitializeInjection).
 * Output: $KERN_CAPTURE_DIR/pid<N>/ (default ./kern-capture/pid<N>/) with
 *   module_<id>.cubin  every module once, as CUPTI hands it over on load;
 *   modules.jsonl      {"id", "sha256", "bytes", "functions"} per module;
 *   launches.jsonl     one line per successful cuLaunchKernel / cuLaunchKernelEx, written on API exit.
 * KERN_CAPTURE_HOST_POINTEES=1 adds "pointee" (hex, up to 64 bytes) to 8-byte params that point to
 * readable host memory. The format is documented in docs/mining.md.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cupti.h>

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define POINTEE_BYTES 64
#define MAX_PARAMS 4096
#define FLUSH_EVERY 512

/* ---------------------------------------------------------------- SHA-256 */

typedef struct {
    uint32_t h[8];
    uint64_t len;
    uint8_t buf[64];
    size_t fill;
} sha256_ctx;

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static void sha256_block(sha256_ctx *c, const uint8_t *p) {
    uint32_t w[64], s[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 |
               (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    memcpy(s, c->h, sizeof s);
    for (int i = 0; i < 64; i++) {
        uint32_t e = s[4], a = s[0];
        uint32_t t1 = s[7] + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & s[5]) ^ (~e & s[6])) + K256[i] + w[i];
        uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & s[1]) ^ (a & s[2]) ^ (s[1] & s[2]));
        memmove(s + 1, s, 7 * sizeof(uint32_t));
        s[4] += t1;
        s[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) c->h[i] += s[i];
}

static void sha256_hex(const uint8_t *data, size_t n, char out[65]) {
    sha256_ctx c = {{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab,
                     0x5be0cd19},
                    0, {0}, 0};
    size_t i = 0;
    for (; i + 64 <= n; i += 64) sha256_block(&c, data + i);
    uint8_t tail[128] = {0};
    size_t rest = n - i;
    memcpy(tail, data + i, rest);
    tail[rest] = 0x80;
    size_t total = rest + 9 <= 64 ? 64 : 128;
    uint64_t bits = (uint64_t)n * 8;
    for (int b = 0; b < 8; b++) tail[total - 1 - b] = (uint8_t)(bits >> (8 * b));
    sha256_block(&c, tail);
    if (total == 128) sha256_block(&c, tail + 64);
    for (int k = 0; k < 8; k++) snprintf(out + 8 * k, 9, "%08x", c.h[k]);
}

/* ------------------------------------------------------------ growable text */

typedef struct {
    char *p;
    size_t n, cap;
} text;

static void text_reserve(text *t, size_t extra) {
    if (t->n + extra + 1 <= t->cap) return;
    size_t cap = t->cap ? t->cap : 4096;
    while (cap < t->n + extra + 1) cap *= 2;
    char *p = realloc(t->p, cap);
    if (!p) abort();
    t->p = p;
    t->cap = cap;
}

static void text_put(text *t, const char *s, size_t n) {
    text_reserve(t, n);
    memcpy(t->p + t->n, s, n);
    t->n += n;
    t->p[t->n] = 0;
}

static void text_printf(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    text_reserve(t, (size_t)need);
    va_start(ap, fmt);
    vsnprintf(t->p + t->n, (size_t)need + 1, fmt, ap);
    va_end(ap);
    t->n += (size_t)need;
}

static void text_json_string(text *t, const char *s) {
    text_put(t, "\"", 1);
    for (; s && *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            char e[2] = {'\\', (char)ch};
            text_put(t, e, 2);
        } else if (ch < 0x20 || ch >= 0x7f) {
            text_printf(t, "\\u%04x", ch);
        } else {
            text_put(t, (const char *)&ch, 1);
        }
    }
    text_put(t, "\"", 1);
}

static void text_hex(text *t, const uint8_t *p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    text_reserve(t, 2 * n);
    for (size_t i = 0; i < n; i++) {
        t->p[t->n++] = digits[p[i] >> 4];
        t->p[t->n++] = digits[p[i] & 15];
    }
    t->p[t->n] = 0;
}

/* ------------------------------------------------------- cubin entry names */

typedef struct {
    uint32_t id;
    char **names;
    size_t count;
    int live;
} module_info;

/* Entry kernels of an ELF64 cubin: global STT_FUNC symbols. Non-ELF images yield none. */
static void elf_functions(const uint8_t *img, size_t n, module_info *m) {
    if (n < 64 || memcmp(img, "\x7f" "ELF", 4) != 0 || img[4] != 2) return;
    uint64_t shoff;
    uint16_t shentsize, shnum;
    memcpy(&shoff, img + 0x28, 8);
    memcpy(&shentsize, img + 0x3a, 2);
    memcpy(&shnum, img + 0x3c, 2);
    if (shentsize < 64 || shoff > n || (uint64_t)shnum * shentsize > n - shoff) return;
    for (uint16_t i = 0; i < shnum; i++) {
        const uint8_t *sh = img + shoff + (uint64_t)i * shentsize;
        uint32_t type, link;
        uint64_t off, size, entsize;
        memcpy(&type, sh + 4, 4);
        memcpy(&off, sh + 0x18, 8);
        memcpy(&size, sh + 0x20, 8);
        memcpy(&link, sh + 0x28, 4);
        memcpy(&entsize, sh + 0x38, 8);
        if (type != 2 || entsize < 24 || off > n || size > n - off || link >= shnum) continue;
        const uint8_t *strsh = img + shoff + (uint64_t)link * shentsize;
        uint64_t stroff, strsize;
        memcpy(&stroff, strsh + 0x18, 8);
        memcpy(&strsize, strsh + 0x20, 8);
        if (stroff > n || strsize > n - stroff) continue;
        for (uint64_t k = 0; k + entsize <= size; k += entsize) {
            const uint8_t *sym = img + off + k;
            uint32_t name;
            memcpy(&name, sym, 4);
            uint8_t info = sym[4];
            if ((info & 0xf) != 2 || (info >> 4) != 1 || name >= strsize) continue;
            const char *s = (const char *)img + stroff + name;
            size_t len = strnlen(s, strsize - name);
            if (len == 0 || len == strsize - name) continue;
            char **grown = realloc(m->names, (m->count + 1) * sizeof(char *));
            if (!grown) abort();
            m->names = grown;
            m->names[m->count++] = strndup(s, len);
        }
    }
}

/* ------------------------------------------------------------------ state */

typedef CUresult (*fn_func_get_module)(CUmodule *, CUfunction);
typedef CUresult (*fn_func_get_param_info)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*fn_kernel_get_param_info)(CUkernel, size_t, size_t *, size_t *);
typedef CUresult (*fn_pointer_get_attributes)(unsigned int, CUpointer_attribute *, void **, CUdeviceptr);
typedef CUresult (*fn_mem_get_address_range)(CUdeviceptr *, size_t *, CUdeviceptr);

typedef struct {
    CUfunction f;
    char *symbol;
    int64_t module; /* -1: unknown */
    int nparams;    /* -1: unknown layout */
    uint32_t *offsets, *sizes;
} func_info;

typedef struct {
    CUmodule handle;
    uint32_t id;
} module_handle;

static struct {
    pthread_mutex_t lock;
    char dir[4096];
    FILE *launches, *modules;
    int host_pointees;
    uint64_t lines;
    module_info *mods;
    size_t nmods;
    func_info *funcs; /* open addressing on f */
    size_t funcs_cap, funcs_len;
    module_handle *handles;
    size_t nhandles;
    fn_func_get_module func_get_module;
    fn_func_get_param_info func_get_param_info;
    fn_kernel_get_param_info kernel_get_param_info;
    fn_pointer_get_attributes pointer_get_attributes;
    fn_mem_get_address_range mem_get_address_range;
} G = {.lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP};

/* Modules whose load callback ran on this thread during the current launch call. */
static __thread uint32_t tl_loaded[32];
static __thread int tl_nloaded;
static __thread text tl_line;

static void report(const char *what, CUptiResult r) {
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    fprintf(stderr, "kern_capture: %s failed: %s\n", what, s ? s : "unknown CUPTI error");
}

static module_info *find_module(uint32_t id) {
    for (size_t i = 0; i < G.nmods; i++)
        if (G.mods[i].id == id) return &G.mods[i];
    return NULL;
}

static int module_has(const module_info *m, const char *symbol) {
    for (size_t i = 0; i < m->count; i++)
        if (strcmp(m->names[i], symbol) == 0) return 1;
    return 0;
}

static void on_module_loaded(const CUpti_ModuleResourceData *md) {
    if (tl_nloaded < (int)(sizeof tl_loaded / sizeof tl_loaded[0])) tl_loaded[tl_nloaded++] = md->moduleId;
    module_info *known = find_module(md->moduleId);
    if (known) {
        known->live = 1;
        return;
    }
    module_info *grown = realloc(G.mods, (G.nmods + 1) * sizeof(module_info));
    if (!grown) abort();
    G.mods = grown;
    module_info *m = &G.mods[G.nmods++];
    memset(m, 0, sizeof *m);
    m->id = md->moduleId;
    m->live = 1;
    const uint8_t *img = (const uint8_t *)md->pCubin;
    size_t n = img ? md->cubinSize : 0;
    elf_functions(img, n, m);
    char path[4200], hex[65];
    snprintf(path, sizeof path, "%s/module_%u.cubin", G.dir, md->moduleId);
    FILE *f = fopen(path, "wb");
    if (f) {
        if (n) fwrite(img, 1, n, f);
        fclose(f);
    } else {
        fprintf(stderr, "kern_capture: cannot write %s: %s\n", path, strerror(errno));
    }
    sha256_hex(img ? img : (const uint8_t *)"", n, hex);
    text t = {0};
    text_printf(&t, "{\"id\": %u, \"sha256\": \"%s\", \"bytes\": %zu, \"functions\": [", md->moduleId, hex, n);
    for (size_t i = 0; i < m->count; i++) {
        if (i) text_put(&t, ", ", 2);
        text_json_string(&t, m->names[i]);
    }
    text_put(&t, "]}\n", 3);
    fwrite(t.p, 1, t.n, G.modules);
    fflush(G.modules);
    free(t.p);
}

static void forget_module(uint32_t id) {
    module_info *m = find_module(id);
    if (m) m->live = 0;
    for (size_t i = 0; i < G.funcs_cap; i++) {
        func_info *fi = &G.funcs[i];
        if (fi->f && fi->module == (int64_t)id) fi->module = -2; /* stale: resolve again */
    }
    for (size_t i = 0; i < G.nhandles; i++)
        if (G.handles[i].id == id) G.handles[i].handle = NULL;
}

/* ------------------------------------------------------ function resolution */

static func_info *func_slot(CUfunction f) {
    if (G.funcs_len * 2 >= G.funcs_cap) {
        size_t cap = G.funcs_cap ? G.funcs_cap * 2 : 1024;
        func_info *old = G.funcs;
        size_t oldcap = G.funcs_cap;
        G.funcs = calloc(cap, sizeof(func_info));
        if (!G.funcs) abort();
        G.funcs_cap = cap;
        for (size_t i = 0; i < oldcap; i++) {
            if (!old[i].f) continue;
            size_t h = ((uintptr_t)old[i].f >> 4) & (cap - 1);
            while (G.funcs[h].f) h = (h + 1) & (cap - 1);
            G.funcs[h] = old[i];
        }
        free(old);
    }
    size_t h = ((uintptr_t)f >> 4) & (G.funcs_cap - 1);
    while (G.funcs[h].f && G.funcs[h].f != f) h = (h + 1) & (G.funcs_cap - 1);
    return &G.funcs[h];
}

static int64_t handle_lookup(CUmodule handle) {
    for (size_t i = 0; i < G.nhandles; i++)
        if (G.handles[i].handle == handle) return G.handles[i].id;
    return -1;
}

static void handle_remember(CUmodule handle, uint32_t id) {
    module_handle *grown = realloc(G.handles, (G.nhandles + 1) * sizeof(module_handle));
    if (!grown) abort();
    G.handles = grown;
    G.handles[G.nhandles].handle = handle;
    G.handles[G.nhandles++].id = id;
}

/* The module a launched function came from: its CUmodule if seen before; else the module loaded
 * during this launch that defines the symbol; else the only live module that defines it.
 * Called with G.lock held; makes no driver call. */
static int64_t resolve_module(CUmodule handle, const char *symbol) {
    if (handle) {
        int64_t id = handle_lookup(handle);
        if (id >= 0) return id;
    }
    int64_t found = -1;
    for (int i = 0; i < tl_nloaded && found < 0; i++) {
        module_info *m = find_module(tl_loaded[i]);
        if (m && module_has(m, symbol)) found = m->id;
    }
    if (found < 0) {
        int matches = 0;
        for (size_t i = 0; i < G.nmods; i++)
            if (G.mods[i].live && module_has(&G.mods[i], symbol)) {
                matches++;
                found = G.mods[i].id;
            }
        if (matches != 1) found = -1;
    }
    if (found >= 0 && handle) handle_remember(handle, (uint32_t)found);
    return found;
}

/* The parameter layout through cuFuncGetParamInfo (or cuKernelGetParamInfo for CUkernel handles).
 * Returns the count, or -1 when the driver knows no layout. Called without G.lock. */
static int query_layout(CUfunction f, uint32_t **offsets, uint32_t **sizes) {
    size_t off, size;
    static __thread uint32_t offs[MAX_PARAMS], szs[MAX_PARAMS];
    int n = 0, by_kernel = 0;
    CUresult r = G.func_get_param_info ? G.func_get_param_info(f, 0, &off, &size) : CUDA_ERROR_NOT_SUPPORTED;
    if (r != CUDA_SUCCESS && r != CUDA_ERROR_INVALID_VALUE && G.kernel_get_param_info) {
        r = G.kernel_get_param_info((CUkernel)f, 0, &off, &size);
        by_kernel = 1;
    }
    if (r == CUDA_ERROR_INVALID_VALUE) return 0; /* index 0 out of range: no params */
    if (r != CUDA_SUCCESS) return -1;
    while (r == CUDA_SUCCESS && n < MAX_PARAMS) {
        offs[n] = (uint32_t)off;
        szs[n++] = (uint32_t)size;
        r = by_kernel ? G.kernel_get_param_info((CUkernel)f, (size_t)n, &off, &size)
                      : G.func_get_param_info(f, (size_t)n, &off, &size);
    }
    *offsets = malloc(n * sizeof(uint32_t));
    *sizes = malloc(n * sizeof(uint32_t));
    if (!*offsets || !*sizes) abort();
    memcpy(*offsets, offs, n * sizeof(uint32_t));
    memcpy(*sizes, szs, n * sizeof(uint32_t));
    return n;
}

typedef struct {
    int64_t module;
    int nparams;
    const uint32_t *offsets, *sizes;
} func_view;

static int cached_view(CUfunction f, const char *symbol, func_view *out) {
    func_info *fi = func_slot(f);
    if (fi->f != f || fi->module == -2 || !fi->symbol || strcmp(fi->symbol, symbol) != 0) return 0;
    *out = (func_view){fi->module, fi->nparams, fi->offsets, fi->sizes};
    return 1;
}

/* What a launch needs to know about its function. Driver calls happen outside G.lock: a driver
 * thread that holds its own lock may be waiting in our module callback for G.lock.
 * NOTE: layout arrays are never freed, so views stay valid while another thread re-resolves. */
static void function_view(CUfunction f, const char *symbol, func_view *out) {
    pthread_mutex_lock(&G.lock);
    int hit = cached_view(f, symbol, out);
    pthread_mutex_unlock(&G.lock);
    if (hit) return;
    CUmodule handle = NULL;
    if (!G.func_get_module || G.func_get_module(&handle, f) != CUDA_SUCCESS) handle = NULL;
    uint32_t *offsets = NULL, *sizes = NULL;
    int nparams = query_layout(f, &offsets, &sizes);
    pthread_mutex_lock(&G.lock);
    if (!cached_view(f, symbol, out)) {
        func_info *fi = func_slot(f);
        if (fi->f != f) G.funcs_len++;
        *fi = (func_info){f, strdup(symbol), resolve_module(handle, symbol), nparams, offsets, sizes};
        *out = (func_view){fi->module, nparams, offsets, sizes};
    }
    pthread_mutex_unlock(&G.lock);
}

/* ------------------------------------------------------------ launch lines */

static int host_readable(uint64_t addr, uint8_t *out, size_t n) {
    struct iovec local = {out, n}, remote = {(void *)(uintptr_t)addr, n};
    return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == (ssize_t)n;
}

static void put_pointee(text *t, const uint8_t *bytes, size_t n) {
    text_put(t, ", \"pointee\": \"", 14);
    text_hex(t, bytes, n);
    text_put(t, "\"", 1);
}

static void put_pointer(text *t, uint64_t value) {
    unsigned int memtype = 0, managed = 0;
    CUdeviceptr start = 0;
    size_t size = 0;
    int known = 0;
    if (value && G.pointer_get_attributes) {
        CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
        void *data[4] = {&memtype, &managed, &start, &size};
        known = G.pointer_get_attributes(4, attrs, data, (CUdeviceptr)value) == CUDA_SUCCESS && memtype != 0;
    }
    if (known && memtype == CU_MEMORYTYPE_DEVICE && size == 0 && G.mem_get_address_range)
        G.mem_get_address_range(&start, &size, (CUdeviceptr)value);
    if (!known) {
        text_put(t, ", \"pointer\": null", 17);
        uint8_t bytes[POINTEE_BYTES];
        if (G.host_pointees && value >= 4096 && host_readable(value, bytes, sizeof bytes))
            put_pointee(t, bytes, sizeof bytes);
        return;
    }
    const char *kind = managed ? "managed" : memtype == CU_MEMORYTYPE_HOST ? "host" : "device";
    text_printf(t, ", \"pointer\": {\"memory_type\": \"%s\", \"range_start\": %llu, \"range_size\": %zu}", kind,
                (unsigned long long)start, size);
    if (G.host_pointees && (managed || memtype == CU_MEMORYTYPE_HOST)) {
        uint8_t bytes[POINTEE_BYTES];
        size_t n = POINTEE_BYTES;
        if (size) {
            uint64_t end = (uint64_t)start + size, left = end > value ? end - value : 0;
            n = left < POINTEE_BYTES ? (size_t)left : POINTEE_BYTES;
        }
        /* NOTE: pinned, registered and managed memory is host-accessible: when the safe read is
         * refused (seccomp, device-resident managed pages), read it directly within its range. */
        if (host_readable(value, bytes, n))
            put_pointee(t, bytes, n);
        else if (size)
            put_pointee(t, (const uint8_t *)(uintptr_t)value, n);
    }
}

static void put_params(text *t, const func_view *fi, void **kernel_params, void **extra) {
    if (!kernel_params && extra) {
        text_put(t, "null", 4);
        return;
    }
    if (fi->nparams < 0 || (!kernel_params && fi->nparams > 0)) {
        text_put(t, "\"unknown-layout\"", 16);
        return;
    }
    text_put(t, "[", 1);
    for (int i = 0; i < fi->nparams; i++) {
        const uint8_t *p = (const uint8_t *)kernel_params[i];
        text_printf(t, "%s{\"offset\": %u, \"size\": %u, \"data\": \"", i ? ", " : "", fi->offsets[i], fi->sizes[i]);
        text_hex(t, p, fi->sizes[i]);
        text_put(t, "\"", 1);
        if (fi->sizes[i] == 8) {
            uint64_t value;
            memcpy(&value, p, 8);
            put_pointer(t, value);
        } else {
            text_put(t, ", \"pointer\": null", 17);
        }
        text_put(t, "}", 1);
    }
    text_put(t, "]", 1);
}

typedef struct {
    CUfunction f;
    unsigned grid[3], block[3], shared_mem;
    int has_cluster;
    unsigned cluster[3];
    void **kernel_params, **extra;
} launch_view;

static int view_launch(CUpti_CallbackId cbid, const void *params, launch_view *v) {
    memset(v, 0, sizeof *v);
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel || cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz) {
        const cuLaunchKernel_params *p = params;
        *v = (launch_view){p->f, {p->gridDimX, p->gridDimY, p->gridDimZ}, {p->blockDimX, p->blockDimY, p->blockDimZ},
                           p->sharedMemBytes, 0, {0, 0, 0}, p->kernelParams, p->extra};
        return 1;
    }
    if (cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx || cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz) {
        const cuLaunchKernelEx_params *p = params;
        const CUlaunchConfig *c = p->config;
        if (!c) return 0;
        *v = (launch_view){p->f, {c->gridDimX, c->gridDimY, c->gridDimZ}, {c->blockDimX, c->blockDimY, c->blockDimZ},
                           c->sharedMemBytes, 0, {0, 0, 0}, p->kernelParams, p->extra};
        for (unsigned i = 0; i < c->numAttrs; i++) {
            if (c->attrs[i].id != CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) continue;
            v->has_cluster = 1;
            v->cluster[0] = c->attrs[i].value.clusterDim.x;
            v->cluster[1] = c->attrs[i].value.clusterDim.y;
            v->cluster[2] = c->attrs[i].value.clusterDim.z;
        }
        return 1;
    }
    return 0;
}

static void on_launch_exit(CUpti_CallbackId cbid, const CUpti_CallbackData *cb) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t t_ns = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    launch_view v;
    if (!cb->functionReturnValue || *(CUresult *)cb->functionReturnValue != CUDA_SUCCESS) return;
    if (!view_launch(cbid, cb->functionParams, &v)) return;
    const char *symbol = cb->symbolName ? cb->symbolName : "";
    func_view fi;
    function_view(v.f, symbol, &fi);
    text *t = &tl_line;
    t->n = 0;
    text_printf(t, "{\"t_ns\": %llu, \"symbol\": ", (unsigned long long)t_ns);
    text_json_string(t, symbol);
    if (fi.module >= 0)
        text_printf(t, ", \"module\": %lld", (long long)fi.module);
    else
        text_put(t, ", \"module\": null", 16);
    text_printf(t, ", \"grid\": [%u, %u, %u], \"block\": [%u, %u, %u], \"shared_mem\": %u, \"cluster\": ", v.grid[0],
                v.grid[1], v.grid[2], v.block[0], v.block[1], v.block[2], v.shared_mem);
    if (v.has_cluster)
        text_printf(t, "[%u, %u, %u]", v.cluster[0], v.cluster[1], v.cluster[2]);
    else
        text_put(t, "null", 4);
    text_put(t, ", \"params\": ", 12);
    put_params(t, &fi, v.kernel_params, v.extra);
    text_put(t, "}\n", 2);
    pthread_mutex_lock(&G.lock);
    fwrite(t->p, 1, t->n, G.launches);
    if (++G.lines % FLUSH_EVERY == 0) fflush(G.launches);
    pthread_mutex_unlock(&G.lock);
}

static void CUPTIAPI on_callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *data) {
    (void)userdata;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
        const CUpti_ResourceData *rd = data;
        const CUpti_ModuleResourceData *md = rd->resourceDescriptor;
        if (!md) return;
        pthread_mutex_lock(&G.lock);
        if (cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED) on_module_loaded(md);
        if (cbid == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING) forget_module(md->moduleId);
        pthread_mutex_unlock(&G.lock);
        return;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite == CUPTI_API_ENTER)
        tl_nloaded = 0;
    else
        on_launch_exit(cbid, cb);
}

/* ----------------------------------------------------------------- set-up */

static void flush_all(void) {
    pthread_mutex_lock(&G.lock);
    if (G.launches) fflush(G.launches);
    if (G.modules) fflush(G.modules);
    pthread_mutex_unlock(&G.lock);
}

static void *driver_symbol(const char *name) {
    void *lib = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    void *sym = lib ? dlsym(lib, name) : NULL;
    return sym ? sym : dlsym(RTLD_DEFAULT, name);
}

static int make_dirs(const char *path) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(buf, 0777) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(buf, 0777) != 0 && errno != EEXIST ? -1 : 0;
}

static FILE *open_output(const char *name) {
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", G.dir, name);
    FILE *f = fopen(path, "w");
    if (!f) fprintf(stderr, "kern_capture: cannot open %s: %s\n", path, strerror(errno));
    return f;
}

int InitializeInjection(void) {
    const char *base = getenv("KERN_CAPTURE_DIR");
    const char *pointees = getenv("KERN_CAPTURE_HOST_POINTEES");
    G.host_pointees = pointees && strcmp(pointees, "1") == 0;
    snprintf(G.dir, sizeof G.dir, "%s/pid%d", base && *base ? base : "kern-capture", (int)getpid());
    if (make_dirs(G.dir) != 0) {
        fprintf(stderr, "kern_capture: cannot create %s: %s\n", G.dir, strerror(errno));
        return 0;
    }
    G.launches = open_output("launches.jsonl");
    G.modules = open_output("modules.jsonl");
    if (!G.launches || !G.modules) return 0;
    setvbuf(G.launches, NULL, _IOFBF, 1 << 20);
    G.func_get_module = (fn_func_get_module)driver_symbol("cuFuncGetModule");
    G.func_get_param_info = (fn_func_get_param_info)driver_symbol("cuFuncGetParamInfo");
    G.kernel_get_param_info = (fn_kernel_get_param_info)driver_symbol("cuKernelGetParamInfo");
    G.pointer_get_attributes = (fn_pointer_get_attributes)driver_symbol("cuPointerGetAttributes");
    G.mem_get_address_range = (fn_mem_get_address_range)driver_symbol("cuMemGetAddressRange_v2");
    CUpti_SubscriberHandle sub;
    CUptiResult r = cuptiSubscribe(&sub, (CUpti_CallbackFunc)on_callback, NULL);
    if (r != CUPTI_SUCCESS) {
        report("cuptiSubscribe", r);
        return 0;
    }
    const CUpti_CallbackId launches[] = {
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz};
    for (size_t i = 0; i < sizeof launches / sizeof launches[0]; i++)
        if ((r = cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, launches[i])) != CUPTI_SUCCESS)
            report("cuptiEnableCallback", r);
    if ((r = cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED)) != CUPTI_SUCCESS)
        report("cuptiEnableCallback(module loaded)", r);
    if ((r = cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING)) !=
        CUPTI_SUCCESS)
        report("cuptiEnableCallback(module unload)", r);
    atexit(flush_all);
    return 1;
}
