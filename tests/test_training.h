// Helpers shared by the training suites (test_train, test_train_lm): scratch folders, files,
// experiments from YAML text, a training run that must succeed, and a run's metrics.jsonl.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "tessera/config.h"
#include "tessera/train.h"

namespace tessera::testing_train {

// A fresh folder under the test temp dir: PREFIX_NAME_PID.
inline std::string temp_dir(const std::string& prefix, const std::string& name) {
  const std::string d = ::testing::TempDir() + prefix + "_" + name + "_" + std::to_string(getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

inline void write(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

inline std::string slurp(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

inline bool has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

inline std::optional<Experiment> try_load(const std::string& yaml, const std::string& dir, Diagnostics* d) {
  return load_experiment_from_string(yaml, "exp.yaml", dir, {}, d);
}

inline Experiment load(const std::string& yaml, const std::string& dir) {
  Diagnostics d;
  std::optional<Experiment> e = try_load(yaml, dir, &d);
  EXPECT_TRUE(e) << d.str();
  return e ? *e : Experiment{};
}

// Quiet training into `out`.
inline TrainOptions train_options(const std::string& out, bool resume = false, bool force = false) {
  TrainOptions o;
  o.out_dir = out;
  o.resume = resume;
  o.force = force;
  o.progress = false;
  return o;
}

inline TrainSummary train_ok(const Experiment& e, const TrainOptions& o) {
  Result<TrainSummary> r = train_experiment(e, o);
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : TrainSummary{};
}

inline std::vector<nlohmann::json> metrics(const std::string& run) {
  std::vector<nlohmann::json> out;
  std::ifstream f(run + "/metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

}  // namespace tessera::testing_train
