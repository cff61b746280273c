/* A plugin built for another ABI version (999), in plain C11: the host must refuse it, naming the
 * file and both versions. Also proves that tessera/plugin.h compiles as C11. */
#include "tessera/plugin.h"

static const tsr_plugin_info kInfo = {sizeof(tsr_plugin_info), "future", "text", "9.9.9",
                                      "a plugin from a future Tessera", 0, 0, TSR_INPUT_TEXT, ""};
static const tsr_plugin kTable = {sizeof(tsr_plugin), 999u, &kInfo, 0, 0, 0, 0, 0, 0, 0};

TSR_PLUGIN_EXPORT const tsr_plugin* tessera_plugin_entry(uint32_t host_abi_version) {
  (void)host_abi_version;
  return &kTable;
}
