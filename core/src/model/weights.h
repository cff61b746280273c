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

}  // namespace tessera::model
