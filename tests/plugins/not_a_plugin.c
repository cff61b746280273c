/* A shared library that is not a Tessera plugin: it lacks tessera_plugin_entry. */
int tessera_something_else(void) { return 42; }
