// The baselines of train.baseline: counted unigram and bigram models, and the proximity model
// (the mean of the last few token embeddings, one linear layer to the vocabulary) with its
// backward. Plain loops on one thread: they are yardsticks, not models to make fast.
#include <algorithm>
#include <cmath>
#include <string>

#include "tessera/random.h"
#include "tessera/train.h"

namespace tessera {

Result<NgramModel> NgramModel::count(int order, const std::vector<int32_t>& stream, int64_t vocab, double add_k) {
  if (order != 1 && order != 2) return Status::Invalid("n-gram baseline: order " + std::to_string(order) + " is not 1 or 2");
  if (vocab <= 0) return Status::Invalid("n-gram baseline: the vocabulary is empty");
  if (!(add_k > 0)) return Status::Invalid("n-gram baseline: add_k must be > 0");
  NgramModel m;
  m.order = order;
  m.vocab = vocab;
  m.add_k = add_k;
  m.unigrams.assign(static_cast<size_t>(vocab), 0);
  if (order == 2) {
    m.bigrams.assign(static_cast<size_t>(vocab * vocab), 0);
    m.contexts.assign(static_cast<size_t>(vocab), 0);
  }
  for (size_t t = 0; t < stream.size(); ++t) {
    const int32_t b = stream[t];
    if (b < 0 || b >= vocab)
      return Status::Invalid("n-gram baseline: token " + std::to_string(t) + " of the training stream is id " +
                             std::to_string(b) + ", outside the vocabulary [0, " + std::to_string(vocab) +
                             "): raise model.stem.vocab_size to the plugin's vocabulary");
    ++m.unigrams[static_cast<size_t>(b)];
    if (order == 2 && t > 0) {
      const int32_t a = stream[t - 1];
      ++m.bigrams[static_cast<size_t>(a * vocab + b)];
      ++m.contexts[static_cast<size_t>(a)];
    }
  }
  m.total = static_cast<int64_t>(stream.size());
  return m;
}

double NgramModel::prob(int32_t prev, int32_t next) const {
  const double kV = add_k * static_cast<double>(vocab);
  if (order == 1) return (static_cast<double>(unigrams[static_cast<size_t>(next)]) + add_k) / (static_cast<double>(total) + kV);
  return (static_cast<double>(bigrams[static_cast<size_t>(prev * vocab + next)]) + add_k) /
         (static_cast<double>(contexts[static_cast<size_t>(prev)]) + kV);
}

double NgramModel::nats(const std::vector<int32_t>& stream) const {
  double s = 0;
  for (size_t t = 1; t < stream.size(); ++t) s -= std::log(prob(stream[t - 1], stream[t]));
  return s;
}

Parameters proximity_init(int64_t vocab, int64_t width, uint64_t seed) {
  Rng rng(seed);
  Tensor embed = Tensor::empty({vocab, width}), w = Tensor::empty({width, vocab});
  fill_normal(embed, rng, 0.0, 1.0);  // unit rows: their mean keeps a usable scale
  fill_normal(w, rng, 0.0, 1.0 / std::sqrt(static_cast<double>(width)));
  return Parameters({{"stem.embed", embed}, {"proximity.w", w}, {"proximity.b", Tensor::zeros({vocab})}});
}

double proximity_nats(const Parameters& p, const std::vector<int32_t>& stream, const std::vector<int64_t>& targets,
                      int64_t window, Parameters* grads) {
  const Tensor E = p.get("stem.embed"), W = p.get("proximity.w"), bias = p.get("proximity.b");
  const int64_t V = E.shape()[0], C = E.shape()[1];
  const float* e = E.data<float>();
  const float* w = W.data<float>();
  const float* b = bias.data<float>();
  float *ge = nullptr, *gw = nullptr, *gb = nullptr;
  if (grads) {
    ge = grads->find("stem.embed")->data<float>();
    gw = grads->find("proximity.w")->data<float>();
    gb = grads->find("proximity.b")->data<float>();
  }
  std::vector<double> h(static_cast<size_t>(C)), z(static_cast<size_t>(V)), dh(static_cast<size_t>(C));
  double total = 0;
  for (int64_t t : targets) {
    // h (C): the mean of the window's embeddings.
    const int64_t from = std::max<int64_t>(0, t - window), n = t - from;
    std::fill(h.begin(), h.end(), 0.0);
    for (int64_t j = from; j < t; ++j) {
      const float* row = e + static_cast<int64_t>(stream[static_cast<size_t>(j)]) * C;
      for (int64_t c = 0; c < C; ++c) h[static_cast<size_t>(c)] += row[c];
    }
    for (double& v : h) v /= static_cast<double>(n);
    // z (V) = h W + b, then the softmax's log-sum-exp (its maximum subtracted).
    for (int64_t v = 0; v < V; ++v) z[static_cast<size_t>(v)] = b[v];
    for (int64_t c = 0; c < C; ++c) {
      const double hc = h[static_cast<size_t>(c)];
      const float* wr = w + c * V;
      for (int64_t v = 0; v < V; ++v) z[static_cast<size_t>(v)] += hc * wr[v];
    }
    const double mx = *std::max_element(z.begin(), z.end());
    double s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(z[static_cast<size_t>(v)] - mx);
    const int32_t y = stream[static_cast<size_t>(t)];
    total += std::log(s) + mx - z[static_cast<size_t>(y)];
    if (!grads) continue;
    // dz = softmax(z) - onehot(y); dW += h^T dz; db += dz; dh = W dz; each window row gets dh / n.
    for (int64_t v = 0; v < V; ++v) z[static_cast<size_t>(v)] = std::exp(z[static_cast<size_t>(v)] - mx) / s;
    z[static_cast<size_t>(y)] -= 1.0;
    for (int64_t v = 0; v < V; ++v) gb[v] += static_cast<float>(z[static_cast<size_t>(v)]);
    for (int64_t c = 0; c < C; ++c) {
      const double hc = h[static_cast<size_t>(c)];
      const float* wr = w + c * V;
      float* gwr = gw + c * V;
      double d = 0;
      for (int64_t v = 0; v < V; ++v) {
        gwr[v] += static_cast<float>(hc * z[static_cast<size_t>(v)]);
        d += wr[v] * z[static_cast<size_t>(v)];
      }
      dh[static_cast<size_t>(c)] = d / static_cast<double>(n);
    }
    for (int64_t j = from; j < t; ++j) {
      float* row = ge + static_cast<int64_t>(stream[static_cast<size_t>(j)]) * C;
      for (int64_t c = 0; c < C; ++c) row[c] += static_cast<float>(dh[static_cast<size_t>(c)]);
    }
  }
  return total;
}

}  // namespace tessera
