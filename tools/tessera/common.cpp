// Shared pieces of the subcommands; see common.h.
#include "common.h"

#include "tessera/comm.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "tessera/machine.h"
#include "tessera/npy.h"
#include "tessera/random.h"

namespace tessera::cli {

std::optional<Experiment> load(const std::string& file, const std::vector<std::string>& overrides) {
  Diagnostics diags;
  LoadOptions opts;
  opts.overrides = overrides;
  std::optional<Experiment> exp = load_experiment(file, opts, &diags);
  if (exp) validate_weights(exp->model, &diags);
  if (!diags.empty()) {
    if (launcher_rank() == 0) {  // under MPI every rank reads the same file: rank 0 says what is wrong
      std::fprintf(stderr, "%s\n", diags.str().c_str());
      std::fprintf(stderr, "tessera: %zu problem(s) in %s; nothing was run\n", diags.size(), file.c_str());
    }
    return std::nullopt;
  }
  return exp;
}

int64_t plan_rows(const Experiment& exp) {
  if (!exp.input.ids.empty()) return static_cast<int64_t>(exp.input.ids.size());
  if (exp.input.rows.defined()) return exp.input.rows.dim(0);
  return exp.bench.seq_len;
}

int64_t plan_batch(const Experiment& exp) {
  return !exp.plugins.empty() ? exp.runtime.batch_size : exp.bench.batch;
}

namespace {
thread_local int t_load_failure = kExitBadInput;
}

int load_failure_exit_code() { return t_load_failure; }

std::optional<Loaded> load_and_build(const std::string& file, const std::vector<std::string>& overrides,
                                     int64_t rows, int64_t batch) {
  t_load_failure = kExitBadInput;
  std::optional<Experiment> exp = load(file, overrides);
  if (!exp) return std::nullopt;
  const MemoryPlan plan =
      memory_plan(exp->model, rows > 0 ? rows : plan_rows(*exp), batch > 0 ? batch : plan_batch(*exp));
  if (Status st = check_memory(plan, machine_memory()); !st.ok()) {
    std::fprintf(stderr, "tessera: %s: %s\n", file.c_str(), st.message().c_str());
    t_load_failure = kExitFailure;
    return std::nullopt;
  }
  set_num_threads(exp->runtime.threads);
  Result<Model> model = Model::build(exp->model);
  if (!model.ok()) {
    std::fprintf(stderr, "%s: %s\n", file.c_str(), model.status().message().c_str());
    return std::nullopt;
  }
  return Loaded{std::move(*exp), std::move(model).value()};
}

std::optional<Batch> input_batch(const Experiment& exp, const std::string& ids_arg,
                                 const std::string& rows_npy) {
  const ModelConfig& c = exp.model;
  if (!ids_arg.empty()) {
    std::vector<int32_t> ids;
    std::stringstream ss(ids_arg);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
      char* end = nullptr;
      const long v = std::strtol(tok.c_str(), &end, 10);
      if (tok.empty() || *end != '\0' || v < 0 || v > INT32_MAX) {
        std::fprintf(stderr, "tessera: --ids: \"%s\" is not a token id (expected comma-separated "
                             "integers, e.g. --ids 5,17,2)\n", tok.c_str());
        return std::nullopt;
      }
      ids.push_back(static_cast<int32_t>(v));
    }
    return Batch::from_ids(ids);
  }
  if (!rows_npy.empty()) {
    Result<Tensor> t = npy::load(rows_npy);
    if (!t.ok()) {
      std::fprintf(stderr, "tessera: %s\n", t.status().message().c_str());
      return std::nullopt;
    }
    if (t->rank() == 2) return Batch::from_rows(t.value());
    if (t->rank() == 3) {
      Batch b;
      b.rows = t->to(DType::f32);
      return b;
    }
    std::fprintf(stderr, "tessera: %s: rows must be (T, F) or (B, T, F), got %s\n", rows_npy.c_str(),
                 t->describe().c_str());
    return std::nullopt;
  }
  if (!exp.input.ids.empty()) return Batch::from_ids(exp.input.ids);
  if (exp.input.rows.defined()) return Batch::from_rows(exp.input.rows);
  std::fprintf(stderr, "tessera: %s has no input: add input.%s to the experiment, or pass %s\n",
               exp.file.c_str(), c.stem.kind == StemKind::tokens ? "ids" : "rows",
               c.stem.kind == StemKind::tokens ? "--ids 1,2,3" : "--rows FILE.npy");
  return std::nullopt;
}

Batch random_batch(const ModelConfig& cfg, int64_t batch, int64_t seq_len, uint64_t seed) {
  Rng rng(seed);
  Batch b;
  if (cfg.stem.kind == StemKind::tokens) {
    b.ids = Tensor::empty({batch, seq_len}, DType::i32);
    int32_t* p = b.ids.data<int32_t>();
    for (int64_t i = 0; i < b.ids.numel(); ++i)
      p[i] = static_cast<int32_t>(rng.next_u64() % static_cast<uint64_t>(cfg.stem.vocab_size));
  } else {
    const int64_t F = cfg.stem.kind == StemKind::features ? cfg.stem.n_features : cfg.d_model;
    b.rows = Tensor::empty({batch, seq_len, F});
    fill_normal(b.rows, rng, 0.0, 1.0);
  }
  return b;
}

std::string fmt(double v, int digits, bool fractions) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  if (fractions) {
    for (int q = 1; q <= 64; ++q) {
      const double p = std::round(v * q);
      if (std::fabs(v - p / q) < 1e-6) {
        if (q == 1) return std::to_string(static_cast<long long>(p));
        // smallest denominator wins, so p/q is already in lowest terms
        return std::to_string(static_cast<long long>(p)) + "/" + std::to_string(q);
      }
    }
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  std::string s = buf;
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  if (s == "-0") s = "0";
  return s;
}

std::string fmt_count(double v) {
  const long long n = std::llround(v);
  const std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out = n < 0 ? "-" : "";
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string fmt_bytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string fmt_flops(double v) {
  const char* units[] = {"FLOP", "kFLOP", "MFLOP", "GFLOP", "TFLOP"};
  int u = 0;
  while (v >= 1000 && u < 4) {
    v /= 1000;
    ++u;
  }
  return fmt(v, u == 0 ? 0 : 3, false) + " " + units[u];
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string table(const std::vector<std::vector<std::string>>& rows, int indent) {
  std::vector<size_t> width;
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (width.size() <= i) width.push_back(0);
      // count UTF-8 code points, not bytes, so "ᵀ" and "√" align
      size_t n = 0;
      for (unsigned char ch : r[i]) n += (ch & 0xC0) != 0x80;
      width[i] = std::max(width[i], n);
    }
  std::string out;
  for (const auto& r : rows) {
    std::string line(static_cast<size_t>(indent), ' ');
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) {
        size_t n = 0;
        for (unsigned char ch : r[i]) n += (ch & 0xC0) != 0x80;
        line += std::string(width[i] - n + 2, ' ');
      }
    }
    out += line + "\n";
  }
  return out;
}

}  // namespace tessera::cli
