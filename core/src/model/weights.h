// Parameter resolution (inline YAML, safetensors file, seeded init), shared by model building and
// tests. Private to core/src/model.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "tessera/model.h"
#include "tessera/random.h"

namespace tessera::model {

// Every parameter of parameter_specs(cfg), in that order, with its values.
Result<std::vector<std::pair<std::string, Tensor>>> resolve_parameters(const ModelConfig& cfg);

// Fills t (f32, contiguous, shape s.shape) as s.init and the init config ask.
void init_parameter(const ParamSpec& s, const InitConfig& init, Rng& rng, Tensor& t);

// "" when t is finite; otherwise "tensor \"<name>\"<origin> (f32 (4, 8)) holds NaN at flat index 7 =
// [0, 7] (3 non-finite values in all)".
std::string nonfinite_problem(const std::string& name, const std::string& origin, const Tensor& t);
// What to do about weights that hold NaN or infinities.
inline constexpr const char* kNonFiniteWeightsHint =
    "a model cannot compute with NaN or infinite weights: the file is damaged or was saved from a training "
    "run that diverged; download or export it again, or resume from an earlier checkpoint";

}  // namespace tessera::model
