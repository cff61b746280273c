// A hostile test plugin, written against the raw C ABI of tessera/plugin.h (not plugin.hpp, whose
// guard would catch its exceptions): it encodes text as byte ids (+1) unless the item says
//   SEGV   dereference a null pointer           ABORT  call abort()
//   LOOP   spin forever                         THROW  throw a C++ exception out of encode()
//   ALLOC  allocate and touch memory without bound (and write through the null malloc returns)
//   OOM    allocate until malloc fails, then report "out of memory" as plugin.hpp does
//   OMP    run an OpenMP parallel region of 2 threads first
//   ROWS   return one sequence of 1,000,000 rows (for the host's row limit)
//   KILL   SIGKILL its own process, when the environment's HOSTILE_KILL_RANK names the MPI rank
//          it runs in (OMPI_COMM_WORLD_RANK or PMI_RANK): a rank dying mid-run
// so that the host's isolation of plugins can be tested. Item text containing none of these
// encodes normally.
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/plugin.h"

namespace {

struct Encoding {
  tsr_encoding encoding;  // first: release() gets back from its pointer
  tsr_rows rows;
  std::vector<int32_t> ids, positions;
  std::vector<uint8_t> roles;
  std::vector<tsr_provenance> provenance;
};

volatile int* volatile g_null = nullptr;
volatile char g_sink;

int32_t create(const tsr_option_value*, uint32_t, void** encoder, tsr_error*) {
  static int instance;
  *encoder = &instance;
  return TSR_OK;
}
void destroy(void*) {}
int32_t describe(void*, tsr_encoder_info* info, tsr_error*) {
  info->rows_kind = TSR_ROWS_IDS;
  info->vocab_size = 257;
  info->causal = 1;
  info->pad_id = 0;
  return TSR_OK;
}

int32_t encode(void*, const tsr_item* item, tsr_encoding** out, tsr_error* error) {
  const std::string_view text(reinterpret_cast<const char*>(item->data), item->n_data);
  if (text.find("KILL") != std::string_view::npos) {
    const char* want = std::getenv("HOSTILE_KILL_RANK");
    const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
    if (!rank) rank = std::getenv("PMI_RANK");
    if (want && rank && std::strcmp(want, rank) == 0) std::raise(SIGKILL);
  }
  if (text.find("SEGV") != std::string_view::npos) *g_null = 1;
  if (text.find("ABORT") != std::string_view::npos) std::abort();
  if (text.find("LOOP") != std::string_view::npos)
    for (;;) g_sink = g_sink + 1;
  if (text.find("THROW") != std::string_view::npos) throw std::runtime_error("hostile: thrown across the C ABI");
  if (text.find("ALLOC") != std::string_view::npos) {
    std::vector<char*> blocks;
    for (;;) {
      char* p = static_cast<char*>(std::malloc(16 << 20));
      if (!p) *g_null = 2;  // what careless code does with a failed malloc
      std::memset(p, 1, 16 << 20);
      blocks.push_back(p);
    }
  }
  if (text.find("OOM") != std::string_view::npos) {  // what plugin.hpp reports for a std::bad_alloc
    std::vector<void*> blocks;
    for (void* p; (p = std::malloc(16 << 20)) != nullptr;) {
      std::memset(p, 1, 16 << 20);
      blocks.push_back(p);
    }
    for (void* p : blocks) std::free(p);
    std::strncpy(error->message, "out of memory", TSR_MESSAGE_CAPACITY - 1);
    error->code = TSR_INTERNAL;
    return TSR_INTERNAL;
  }
  if (text.find("OMP") != std::string_view::npos && text.find("OOM") == std::string_view::npos) {
    // An OpenMP parallel region, as a codec built with OpenMP runs one (its rows are as usual).
    int threads = 0;
#pragma omp parallel num_threads(2) reduction(+ : threads)
    threads += 1;
    if (threads != 2) *g_null = 3;
  }
  if (text.empty()) {
    std::strncpy(error->message, "hostile: an empty item", TSR_MESSAGE_CAPACITY - 1);
    error->code = TSR_BAD_INPUT;
    return TSR_BAD_INPUT;
  }
  const size_t n = text.find("ROWS") != std::string_view::npos ? 1000000 : text.size();
  auto* e = new Encoding{};
  for (size_t i = 0; i < n; ++i) {
    e->ids.push_back(static_cast<uint8_t>(text[i % text.size()]) + 1);
    e->positions.push_back(static_cast<int32_t>(i));
    e->positions.push_back(-1);
    e->roles.push_back(TSR_ROLE_CONTENT);
    e->provenance.push_back({TSR_PROV_BYTES, 0, double(i), double(i + 1), 0, 0});
  }
  e->rows.size = sizeof(tsr_rows);
  e->rows.kind = TSR_ROWS_IDS;
  e->rows.n_rows = static_cast<uint32_t>(n);
  e->rows.ids = e->ids.data();
  e->rows.positions = e->positions.data();
  e->rows.roles = e->roles.data();
  e->rows.provenance = e->provenance.data();
  e->rows.picture.size = sizeof(tsr_picture);
  e->rows.label = "";
  e->encoding = {sizeof(tsr_encoding), 1, &e->rows};
  *out = &e->encoding;
  return TSR_OK;
}

void release(void*, tsr_encoding* encoding) { delete reinterpret_cast<Encoding*>(encoding); }

int32_t decode(void*, const int32_t*, size_t, char*, size_t, size_t*, tsr_error*) { return TSR_UNSUPPORTED; }

const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info), "hostile", "text", "0.1.0",
                               "byte ids, and crashes, hangs and exceptions on request", nullptr, 0, TSR_INPUT_TEXT,
                               ".txt"};
const tsr_plugin kTable = {sizeof(tsr_plugin), TSR_PLUGIN_ABI_VERSION, &kInfo, create, destroy, describe,
                           encode,             release,                decode, nullptr};

}  // namespace

extern "C" TSR_PLUGIN_EXPORT const tsr_plugin* tessera_plugin_entry(uint32_t) { return &kTable; }
