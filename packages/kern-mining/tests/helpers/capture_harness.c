/* Drives kern_capture.c's callbacks with fake driver functions and hand-made CUPTI callback data,
 * so the record writer and the launch->module map run without a GPU.
 * Usage: capture_harness OUT_DIR CUBIN (the cubin must define add_one). */
#include "kern_capture.c"

static CUresult fake_get_module(CUmodule *m, CUfunction f) { (void)f; *m = (CUmodule)0x1000; return CUDA_SUCCESS; }
static CUresult fake_param_info(CUfunction f, size_t i, size_t *off, size_t *size) {
    (void)f; if (i >= 2) return CUDA_ERROR_INVALID_VALUE; *off = i * 8; *size = i == 0 ? 8 : 4; return CUDA_SUCCESS; }
static CUresult fake_ptr_attrs(unsigned n, CUpointer_attribute *a, void **d, CUdeviceptr p) {
    (void)n; (void)a;
    if (p >= 0x7f0000000000ull && p < 0x7f0000100000ull) {
        *(unsigned *)d[0] = CU_MEMORYTYPE_DEVICE; *(unsigned *)d[1] = 0;
        *(CUdeviceptr *)d[2] = 0x7f0000000000ull; *(size_t *)d[3] = 0x100000;
    } else *(unsigned *)d[0] = 0;
    return CUDA_SUCCESS; }

static void call(CUpti_CallbackDomain dom, CUpti_CallbackId id, const void *data) { on_callback(NULL, dom, id, data); }

int main(int argc, char **argv) {
    setenv("KERN_CAPTURE_DIR", argv[1], 1);
    setenv("KERN_CAPTURE_HOST_POINTEES", "1", 1);
    int init = InitializeInjection();
    fprintf(stderr, "init=%d\n", init);
    G.func_get_module = fake_get_module; G.func_get_param_info = fake_param_info; G.pointer_get_attributes = fake_ptr_attrs;
    FILE *f = fopen(argv[2], "rb"); static uint8_t img[1 << 20]; size_t n = fread(img, 1, sizeof img, f); fclose(f);
    CUpti_ModuleResourceData md = {7, n, (const char *)img};
    CUpti_ResourceData rd; memset(&rd, 0, sizeof rd); rd.resourceDescriptor = &md;
    uint64_t ptr = 0x7f0000000100ull; int32_t count = 1000;
    void *params[2] = {&ptr, &count};
    cuLaunchKernel_params p = {(CUfunction)0x2000, 4, 1, 1, 256, 1, 1, 0, NULL, params, NULL};
    CUresult ok = CUDA_SUCCESS;
    CUpti_CallbackData cb; memset(&cb, 0, sizeof cb);
    cb.functionParams = &p; cb.symbolName = "add_one"; cb.functionReturnValue = &ok;
    cb.callbackSite = CUPTI_API_ENTER; call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    call(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, &rd);
    cb.callbackSite = CUPTI_API_EXIT; call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    /* Ex with cluster */
    CUlaunchAttribute attr; memset(&attr, 0, sizeof attr); attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = 2; attr.value.clusterDim.y = 1; attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg; memset(&cfg, 0, sizeof cfg); cfg.gridDimX = 4; cfg.gridDimY = 1; cfg.gridDimZ = 1;
    cfg.blockDimX = 128; cfg.blockDimY = 1; cfg.blockDimZ = 1; cfg.attrs = &attr; cfg.numAttrs = 1;
    cuLaunchKernelEx_params pe = {&cfg, (CUfunction)0x2000, params, NULL};
    cb.functionParams = &pe;
    cb.callbackSite = CUPTI_API_ENTER; call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &cb);
    cb.callbackSite = CUPTI_API_EXIT; call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &cb);
    /* packed */
    void *extra[5] = {CU_LAUNCH_PARAM_BUFFER_POINTER, NULL, CU_LAUNCH_PARAM_BUFFER_SIZE, NULL, CU_LAUNCH_PARAM_END};
    cuLaunchKernel_params pp = {(CUfunction)0x2000, 2, 1, 1, 64, 1, 1, 0, NULL, NULL, extra};
    cb.functionParams = &pp;
    cb.callbackSite = CUPTI_API_EXIT; call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    /* unknown function with host pointer to a readable stack buffer; param info fails */
    G.func_get_param_info = NULL;
    cuLaunchKernel_params pu = {(CUfunction)0x3000, 1, 1, 1, 32, 1, 1, 16, NULL, params, NULL};
    cb.functionParams = &pu; cb.symbolName = "weird\"name";
    call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    /* failed launch: not recorded */
    CUresult bad = CUDA_ERROR_INVALID_VALUE; cb.functionReturnValue = &bad;
    call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    G.func_get_param_info = fake_param_info;
    static uint8_t hostbuf[64]; memset(hostbuf, 0xcd, sizeof hostbuf);
    uint64_t hostptr = (uint64_t)(uintptr_t)hostbuf, junk = 0x10;
    void *hp[2] = {&hostptr, &count}; void *jp[2] = {&junk, &count};
    cuLaunchKernel_params ph = {(CUfunction)0x4000, 1, 1, 1, 32, 1, 1, 0, NULL, hp, NULL};
    cb.functionReturnValue = &ok; cb.functionParams = &ph; cb.symbolName = "hostk";
    call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    ph.kernelParams = jp;
    call(CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &cb);
    flush_all();
    return 0;
}
