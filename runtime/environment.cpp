// The environment set at start-up (see environment.h).
#include "runtime/environment.h"

#include <cstdlib>

namespace nanogpt::runtime {

void set_nccl_defaults() {
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0", /*overwrite=*/0);
}

}  // namespace nanogpt::runtime
