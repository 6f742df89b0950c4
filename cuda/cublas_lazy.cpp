// cuBLAS and cuBLASLt loaded at their first call, not when megatrain starts. Their shared libraries' static
// initializers take ~0.4 s (cuBLASLt 13's tables: perf puts 74% of a GPU build's start in call_init), which every
// command paid before doing anything: `megatrain config` and `plan` (no GPU work at all), --help, --version.
// megatrain does not link them; it defines the functions it calls (the headers' exact declarations), each of which
// opens its library once (dlopen: LD_LIBRARY_PATH, then the CUDA toolkit's directory megatrain was built against)
// and calls the library's own definition (dlsym on that handle). A library that cannot be opened is one clear error.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <dlfcn.h>

#include <string>

#include "core/check.h"

namespace {

#define MT_LAZY_STR2(x) #x
#define MT_LAZY_STR(x) MT_LAZY_STR2(x)

// The library's handle, opened at the first call: by its soname (the major version of the headers megatrain was built
// with), then in MEGATRAIN_CUDA_LIBDIR.
void* open_library(const char* stem) {
  const std::string name = std::string(stem) + ".so." + std::to_string(CUBLAS_VER_MAJOR);
  void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
#if defined(MEGATRAIN_CUDA_LIBDIR)
  if (!h) h = dlopen((std::string(MEGATRAIN_CUDA_LIBDIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
  MT_CHECK(h, "cannot load ", name, " (", dlerror(), "): megatrain's GPU build calls cuBLAS from the CUDA toolkit ",
           CUBLAS_VER_MAJOR, "; install it, or add the directory holding ", name, " to LD_LIBRARY_PATH");
  return h;
}
void* cublas_library() {
  static void* const h = open_library("libcublas");
  return h;
}
void* cublaslt_library() {
  static void* const h = open_library("libcublasLt");
  return h;
}
void* symbol(void* library, const char* name) {
  void* f = dlsym(library, name);
  MT_CHECK(f, "the loaded cuBLAS has no ", name, " (", dlerror(), "): megatrain was built against cuBLAS ",
           CUBLAS_VER_MAJOR, ".", CUBLAS_VER_MINOR, "; add that version's directory to LD_LIBRARY_PATH");
  return f;
}

}  // namespace

// ret name params: the header's declaration; args: its parameter names. (name may be a macro of cublas_v2.h, e.g.
// cublasCreate -> cublasCreate_v2: the definition and the looked-up symbol both take the expanded name.)
#define MT_LAZY(library, ret, name, params, args)                                                  \
  ret CUBLASWINAPI name params {                                                                   \
    using Fn = ret(*) params;                                                                      \
    static const Fn fn = reinterpret_cast<Fn>(symbol(library(), MT_LAZY_STR(name)));              \
    return fn args;                                                                                \
  }

MT_LAZY(cublas_library, cublasStatus_t, cublasCreate, (cublasHandle_t * handle), (handle))
MT_LAZY(cublas_library, cublasStatus_t, cublasSetStream, (cublasHandle_t handle, cudaStream_t streamId),
        (handle, streamId))
MT_LAZY(cublas_library, cublasStatus_t, cublasSetMathMode, (cublasHandle_t handle, cublasMath_t mode), (handle, mode))
MT_LAZY(cublas_library, const char*, cublasGetStatusString, (cublasStatus_t status), (status))
MT_LAZY(cublas_library, cublasStatus_t, cublasGemmEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void* alpha, const void* A, cudaDataType Atype, int lda, const void* B, cudaDataType Btype, int ldb,
         const void* beta, void* C, cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
         cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, A, Atype, lda, B, Btype, ldb, beta, C, Ctype, ldc, computeType, algo))
MT_LAZY(cublas_library, cublasStatus_t, cublasGemmBatchedEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void* alpha, const void* const Aarray[], cudaDataType Atype, int lda, const void* const Barray[],
         cudaDataType Btype, int ldb, const void* beta, void* const Carray[], cudaDataType Ctype, int ldc,
         int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, Aarray, Atype, lda, Barray, Btype, ldb, beta, Carray, Ctype, ldc,
         batchCount, computeType, algo))
MT_LAZY(cublas_library, cublasStatus_t, cublasGemmStridedBatchedEx,
        (cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb, int m, int n, int k,
         const void* alpha, const void* A, cudaDataType Atype, int lda, long long int strideA, const void* B,
         cudaDataType Btype, int ldb, long long int strideB, const void* beta, void* C, cudaDataType Ctype, int ldc,
         long long int strideC, int batchCount, cublasComputeType_t computeType, cublasGemmAlgo_t algo),
        (handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB, beta, C, Ctype, ldc,
         strideC, batchCount, computeType, algo))
MT_LAZY(cublas_library, cublasStatus_t, cublasGemmGroupedBatchedEx,
        (cublasHandle_t handle, const cublasOperation_t transa_array[], const cublasOperation_t transb_array[],
         const int m_array[], const int n_array[], const int k_array[], const void* alpha_array,
         const void* const Aarray[], cudaDataType_t Atype, const int lda_array[], const void* const Barray[],
         cudaDataType_t Btype, const int ldb_array[], const void* beta_array, void* const Carray[],
         cudaDataType_t Ctype, const int ldc_array[], int group_count, const int group_size[],
         cublasComputeType_t computeType),
        (handle, transa_array, transb_array, m_array, n_array, k_array, alpha_array, Aarray, Atype, lda_array, Barray,
         Btype, ldb_array, beta_array, Carray, Ctype, ldc_array, group_count, group_size, computeType))

MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtCreate, (cublasLtHandle_t * lightHandle), (lightHandle))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmulDescCreate,
        (cublasLtMatmulDesc_t * matmulDesc, cublasComputeType_t computeType, cudaDataType_t scaleType),
        (matmulDesc, computeType, scaleType))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmulDescSetAttribute,
        (cublasLtMatmulDesc_t matmulDesc, cublasLtMatmulDescAttributes_t attr, const void* buf, size_t sizeInBytes),
        (matmulDesc, attr, buf, sizeInBytes))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatrixLayoutCreate,
        (cublasLtMatrixLayout_t * matLayout, cudaDataType type, uint64_t rows, uint64_t cols, int64_t ld),
        (matLayout, type, rows, cols, ld))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatrixLayoutSetAttribute,
        (cublasLtMatrixLayout_t matLayout, cublasLtMatrixLayoutAttribute_t attr, const void* buf, size_t sizeInBytes),
        (matLayout, attr, buf, sizeInBytes))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmulPreferenceSetAttribute,
        (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr, const void* buf,
         size_t sizeInBytes),
        (pref, attr, buf, sizeInBytes))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmulAlgoGetHeuristic,
        (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t operationDesc, cublasLtMatrixLayout_t Adesc,
         cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
         cublasLtMatmulPreference_t preference, int requestedAlgoCount,
         cublasLtMatmulHeuristicResult_t heuristicResultsArray[], int* returnAlgoCount),
        (lightHandle, operationDesc, Adesc, Bdesc, Cdesc, Ddesc, preference, requestedAlgoCount,
         heuristicResultsArray, returnAlgoCount))
MT_LAZY(cublaslt_library, cublasStatus_t, cublasLtMatmul,
        (cublasLtHandle_t lightHandle, cublasLtMatmulDesc_t computeDesc, const void* alpha, const void* A,
         cublasLtMatrixLayout_t Adesc, const void* B, cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
         cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc, const cublasLtMatmulAlgo_t* algo,
         void* workspace, size_t workspaceSizeInBytes, cudaStream_t stream),
        (lightHandle, computeDesc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D, Ddesc, algo, workspace,
         workspaceSizeInBytes, stream))
