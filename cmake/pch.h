// Precompiled header: LibTorch is ~90% of every translation unit's parse time.
#pragma once
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>
