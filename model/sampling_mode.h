// SamplingMode: what every sampling call holds for its duration (generate, beam search, the
// steppers, the static decoder), restored on every exit.
#pragma once

#include <ATen/Context.h>

#include "model/gpt.h"

namespace nanogpt::model {

// Eval mode, frozen Q/K/V weights and no cuDNN attention for a sampling call; the model and
// LibTorch's attention backends as they were on every exit.
//
// cuDNN's fused attention (which scaled_dot_product_attention prefers for bf16 on recent GPUs)
// builds an execution plan for each new sequence length, and decoding has a new length at every
// token: on an H200 a full-preset model sampled 21 tokens/s in bf16 (~45 ms a token in plan
// building) against 545 in fp32, which takes another kernel. Without it, SDPA picks the flash or
// memory-efficient kernel, which have no plans. Training's shapes are fixed, so it keeps cuDNN.
class SamplingMode {
 public:
  explicit SamplingMode(GPT& model)
      : model_(model), was_training_(model->is_training()), cudnn_attention_(at::globalContext().userEnabledCuDNNSDP()) {
    model_->eval();
    model_->freeze_qkv_weights(true);
    at::globalContext().setSDPUseCuDNN(false);
  }
  ~SamplingMode() {
    at::globalContext().setSDPUseCuDNN(cudnn_attention_);
    model_->freeze_qkv_weights(false);
    model_->train(was_training_);
  }
  SamplingMode(const SamplingMode&) = delete;
  SamplingMode& operator=(const SamplingMode&) = delete;

 private:
  GPT& model_;
  bool was_training_;
  bool cudnn_attention_;
};

}  // namespace nanogpt::model
