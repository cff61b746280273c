// Which loops the optimizer steps run on (tessera/optim.h), and a test hook to choose the
// portable ones: both give the same bits, which tests check.
#pragma once

namespace tessera::train {

// "fma" (AVX2 + FMA, chosen at run time) or "generic" (portable C++), for steps the calling
// thread starts.
const char* optim_isa();

// Optimizer steps started on this thread take the portable loops while the object lives.
class ScopedOptimGeneric {
 public:
  ScopedOptimGeneric();
  ~ScopedOptimGeneric();
  ScopedOptimGeneric(const ScopedOptimGeneric&) = delete;
  ScopedOptimGeneric& operator=(const ScopedOptimGeneric&) = delete;

 private:
  bool saved_;
};

}  // namespace tessera::train
