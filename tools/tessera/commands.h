// The subcommands of `tessera`. Each registers its options on the app and, when chosen, sets
// *run to the function that does the work (so parsing finishes before anything runs).
#pragma once

#include <functional>

namespace CLI {
class App;
}

namespace tessera::cli {

void add_check_command(CLI::App& app, std::function<int()>* run);
void add_explain_command(CLI::App& app, std::function<int()>* run);
void add_forward_command(CLI::App& app, std::function<int()>* run);
void add_bench_command(CLI::App& app, std::function<int()>* run);
void add_drift_command(CLI::App& app, std::function<int()>* run);
void add_export_command(CLI::App& app, std::function<int()>* run);
void add_grad_command(CLI::App& app, std::function<int()>* run);
void add_train_command(CLI::App& app, std::function<int()>* run);
void add_eval_command(CLI::App& app, std::function<int()>* run);
void add_run_command(CLI::App& app, std::function<int()>* run);
void add_generate_command(CLI::App& app, std::function<int()>* run);
void add_plugins_command(CLI::App& app, std::function<int()>* run);
void add_tokenize_command(CLI::App& app, std::function<int()>* run);
void add_schema_command(CLI::App& app, std::function<int()>* run);
void add_search_command(CLI::App& app, std::function<int()>* run);

}  // namespace tessera::cli
