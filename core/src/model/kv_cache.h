// How Model::forward uses a KVCache (tessera/generate.h): binding a batch to the cache's sequences
// and storage, and advancing their lengths once the step is done. Private to core/src/model; the
// cache itself is generate.cpp's.
#pragma once

#include <vector>

#include "layers.h"
#include "tessera/generate.h"
#include "tessera/model.h"

namespace tessera::model {

struct CacheAccess {
  // Checks that `batch` can continue the cache's sequences (a causal model of the cache's shape, one
  // batch row per sequence, no segments or explicit positions, no prepended CLS row, room for the
  // new rows) and gives each batch row's cached length (*past) and each layer's view (*views,
  // pointing at *past).
  static Status bind(KVCache& cache, const ModelConfig& c, const Batch& batch, int64_t extra,
                     std::vector<int64_t>* past, std::vector<CacheView>* views);
  // After a forward that appended the batch's rows: each sequence now holds them too.
  static void advance(KVCache& cache, const Batch& batch);
};

}  // namespace tessera::model
