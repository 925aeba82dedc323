// GPU timeline without Nsight Systems: an LD_PRELOAD library that records CUPTI activity
// (kernels, memcpys, memsets, synchronizations, driver API calls, each with its start and end
// in ns) of a CUDA process and writes one line per record to $TRACE_OUT at exit:
//   K start end correlation kernel-name | C start end correlation kind<copyKind> bytes
//   S start end correlation bytes       | Y start end correlation type<n>
//   D start end correlation driver-API-function
// scripts/gpu_gaps.py reads it: the GPU's idle time per training step and where it falls.
// Build here, after scripts/build_cuda.sh (which clears dist/), with CUPTI's headers and
// library from the wheel of the GPU machine's CUDA version (13.0: its kernel records are
// CUpti_ActivityKernel10; later CUPTI versions add newer layouts):
//   pip download --no-deps "nvidia-cuda-cupti==13.0.*" -d /tmp/cupti && unzip -q -o /tmp/cupti/*.whl -d /tmp/cupti
//   C=/tmp/cupti/nvidia/cu13; mkdir -p dist; cp $C/lib/libcupti.so.13 dist/
//   gcc -shared -fPIC -O2 -I$C/include -I.cuda/include scripts/cupti_trace.c -o dist/libtrace.so -L$C/lib -l:libcupti.so.13 -Wl,-rpath,'$ORIGIN'
// Run on the GPU machine (carry dist/libtrace.so and dist/libcupti.so.13, found beside it):
//   TRACE_OUT=t.txt LD_PRELOAD=$PWD/dist/libtrace.so /tmp/g/train bench training --warmup 2 --steps 4 ...
//   python3 scripts/gpu_gaps.py t.txt --first 3 --count 4
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define BUF (8 << 20)
static FILE* out;
static void CUPTIAPI req(uint8_t** b, size_t* size, size_t* max) {
    *b = (uint8_t*)aligned_alloc(8, BUF); *size = BUF; *max = 0;
}
static void CUPTIAPI done(CUcontext c, uint32_t s, uint8_t* b, size_t size, size_t valid) {
    CUpti_Activity* r = NULL;
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(c, s, &dropped) == CUPTI_SUCCESS && dropped > 0)
        fprintf(stderr, "cupti_trace: %zu records dropped\n", dropped);
    while (out && cuptiActivityGetNextRecord(b, valid, &r) == CUPTI_SUCCESS) {
        switch (r->kind) {
        case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
            CUpti_ActivityKernel10* k = (CUpti_ActivityKernel10*)r;
            fprintf(out, "K %llu %llu %u %s\n", (unsigned long long)k->start, (unsigned long long)k->end, k->correlationId, k->name);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMCPY: {
            CUpti_ActivityMemcpy6* m = (CUpti_ActivityMemcpy6*)r;
            fprintf(out, "C %llu %llu %u kind%d %llu\n", (unsigned long long)m->start, (unsigned long long)m->end, m->correlationId, m->copyKind, (unsigned long long)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_MEMSET: {
            CUpti_ActivityMemset4* m = (CUpti_ActivityMemset4*)r;
            fprintf(out, "S %llu %llu %u %llu\n", (unsigned long long)m->start, (unsigned long long)m->end, m->correlationId, (unsigned long long)m->bytes);
            break;
        }
        case CUPTI_ACTIVITY_KIND_SYNCHRONIZATION: {
            CUpti_ActivitySynchronization2* y = (CUpti_ActivitySynchronization2*)r;
            fprintf(out, "Y %llu %llu %u type%d\n", (unsigned long long)y->start, (unsigned long long)y->end, y->correlationId, (int)y->type);
            break;
        }
        case CUPTI_ACTIVITY_KIND_DRIVER: {
            CUpti_ActivityAPI* a = (CUpti_ActivityAPI*)r;
            const char* name = NULL;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_DRIVER_API, a->cbid, &name);
            fprintf(out, "D %llu %llu %u %s\n", (unsigned long long)a->start, (unsigned long long)a->end, a->correlationId, name ? name : "?");
            break;
        }
        default: break;
        }
    }
    free(b);
}
static void fin(void) {
    cuptiActivityFlushAll(1);
    if (out) fclose(out);
    out = NULL;  // (a buffer delivered after this is dropped)
}
__attribute__((constructor)) static void init(void) {
    const char* p = getenv("TRACE_OUT");
    if (!p) return;
    out = fopen(p, "w");
    if (!out) {
        perror("cupti_trace: TRACE_OUT");
        return;
    }
    cuptiActivityRegisterCallbacks(req, done);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_SYNCHRONIZATION);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER);
    atexit(fin);
}
