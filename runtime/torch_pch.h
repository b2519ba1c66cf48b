#pragma once
// The LibTorch headers the runtime uses, precompiled once (they cost ~45 s a translation unit).
#include <torch/torch.h>
