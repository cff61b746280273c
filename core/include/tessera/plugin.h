/* tessera/plugin.h — the modality plugin ABI, in plain C (C11).
 *
 * A plugin is a shared library that turns one input item (an image file, a sound file, a line of
 * text, a FASTA record) into token rows for the transformer: discrete ids, or float feature rows,
 * each with a position, a role and its provenance in the input. It exports exactly one symbol:
 *
 *   const tsr_plugin* tessera_plugin_entry(uint32_t host_abi_version);
 *
 * which returns a static table of functions. The host (libtessera) loads the library with
 * dlopen(RTLD_NOW | RTLD_LOCAL), calls the entry point, and refuses the plugin unless
 * table->abi_version == TSR_PLUGIN_ABI_VERSION exactly, naming the file and both versions.
 *
 * Lifecycle (host side):
 *   const tsr_plugin* p = tessera_plugin_entry(TSR_PLUGIN_ABI_VERSION);
 *   void* enc;  tsr_error err = {sizeof err};
 *   p->create(options, n_options, &enc, &err);         // validated YAML options, as text
 *   tsr_encoder_info info = {sizeof info};  p->describe(enc, &info, &err);
 *   tsr_encoding* out;  p->encode(enc, &item, &out, &err);   ...use out...;  p->release(enc, out);
 *   p->destroy(enc);
 *
 * Rules of the boundary:
 *   - Every struct starts with `size` (bytes, set by whoever fills it in) and only grows: new
 *     fields go at the end, old ones are never removed or reordered; enum values are never
 *     reused. The reader of a struct must check `size` before touching a field added later.
 *   - No C++ exception, STL type or allocator crosses it. Functions return a tsr_code; on failure
 *     they fill the caller's tsr_error (message always NUL-terminated, truncated to fit).
 *   - Memory a plugin allocates, the plugin releases: an encoding stays valid until release().
 *     Strings and arrays the host passes in are valid only during the call.
 *   - Threads: the host calls one encoder instance from one thread at a time, and creates one
 *     instance per worker thread to decode in parallel. info() and entry may be called anytime.
 *   - Units of provenance, positions and roles are defined below and are part of the ABI.
 *
 * tessera/plugin.hpp is a header-only C++ helper that writes all of this for you.
 */
#ifndef TESSERA_PLUGIN_H
#define TESSERA_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI version this header describes. The host accepts a plugin only when they are equal. */
#define TSR_PLUGIN_ABI_VERSION 1u
#define TSR_PLUGIN_ENTRY_SYMBOL "tessera_plugin_entry"

#if defined(__GNUC__)
#define TSR_PLUGIN_EXPORT __attribute__((visibility("default")))
#else
#define TSR_PLUGIN_EXPORT
#endif

/* Return codes; the same numbers as tessera::Code. */
typedef enum tsr_code {
  TSR_OK = 0,
  TSR_INVALID_ARGUMENT = 1, /* an option or a call that makes no sense */
  TSR_NOT_FOUND = 2,        /* a file an option names is missing */
  TSR_IO_ERROR = 3,
  TSR_BAD_INPUT = 4,        /* the item itself is broken: corrupt image, truncated WAV, bad FASTA */
  TSR_UNSUPPORTED = 5,      /* valid, but this plugin cannot do it (e.g. decode() on images) */
  TSR_OUT_OF_RANGE = 6,     /* too long for the length policy, an id outside the vocabulary */
  TSR_INTERNAL = 7
} tsr_code;

#define TSR_MESSAGE_CAPACITY 1024
#define TSR_KEY_CAPACITY 128

/* Filled in by the plugin when a call fails. The host sets size and zeroes the rest. */
typedef struct tsr_error {
  uint32_t size;
  int32_t code;                     /* a tsr_code */
  char message[TSR_MESSAGE_CAPACITY]; /* what is wrong, where, and what to do */
  char option[TSR_KEY_CAPACITY];    /* create(): the option at fault ("vocab"), or "" */
} tsr_error;

/* ---- Options --------------------------------------------------------------------------------
 * A plugin lists its YAML options; the host validates the experiment's values against them (with
 * file:line:col errors, like every other key) and passes them to create() as canonical text. */
typedef enum tsr_option_type {
  TSR_OPT_BOOL = 0,       /* "true" | "false" */
  TSR_OPT_INT = 1,        /* decimal, fits int64 */
  TSR_OPT_FLOAT = 2,      /* "%.17g" */
  TSR_OPT_STRING = 3,
  TSR_OPT_PATH = 4,       /* made absolute by the host (relative to the YAML file); must exist */
  TSR_OPT_ENUM = 5,       /* one of `choices` */
  TSR_OPT_FLOAT_LIST = 6, /* comma-separated, "0.5,0.5,0.5" */
  TSR_OPT_INT_LIST = 7    /* comma-separated, "224,224" */
} tsr_option_type;

typedef struct tsr_option_spec {
  uint32_t size;
  const char* name;          /* "vocab", "image_size" */
  uint32_t type;             /* a tsr_option_type */
  const char* default_value; /* YAML text of the default, or NULL when the option is required */
  const char* meaning;       /* one line for `tessera plugins` and the docs */
  const char* choices;       /* TSR_OPT_ENUM: "bpe|wordpiece|bytes|chars"; otherwise NULL */
} tsr_option_spec;

typedef struct tsr_option_value {
  uint32_t size;
  const char* name;
  const char* value; /* canonical text, see tsr_option_type; every option is passed, defaults too */
} tsr_option_value;

/* ---- What a plugin is ---------------------------------------------------------------------- */
typedef enum tsr_rows_kind {
  TSR_ROWS_IDS = 0,     /* discrete ids: the model's token stem looks them up */
  TSR_ROWS_FEATURES = 1 /* float feature rows: the model's feature stem projects them */
} tsr_rows_kind;

typedef enum tsr_input_kind {
  TSR_INPUT_FILE = 0, /* an item is a whole file's bytes (images, sound files) */
  TSR_INPUT_TEXT = 1  /* an item is UTF-8 text: a line, a FASTA record, a manifest's inline text */
} tsr_input_kind;

typedef struct tsr_plugin_info {
  uint32_t size;
  const char* name;        /* "text": the name experiments use; the file is libtessera_<name>.so */
  const char* modality;    /* "text", "image", "audio", "protein", "dna", ... */
  const char* version;     /* the plugin's own version, "1.2.0" */
  const char* description; /* one line */
  const tsr_option_spec* options;
  uint32_t n_options;
  uint32_t input_kind;     /* a tsr_input_kind */
  const char* extensions;  /* files it reads from a directory: ".png|.jpg|.jpeg"; "" = any */
} tsr_plugin_info;

/* What an encoder instance produces, known after create(). */
typedef struct tsr_encoder_info {
  uint32_t size;
  uint32_t rows_kind;  /* a tsr_rows_kind */
  uint32_t width;      /* TSR_ROWS_FEATURES: values per row (patch_size² · channels, n_mels, ...) */
  int64_t vocab_size;  /* TSR_ROWS_IDS: ids are in [0, vocab_size) */
  int32_t causal;      /* 1: the modality reads left to right (text); 0: every row sees every row */
  int32_t pad_id;      /* TSR_ROWS_IDS: the id of padding, or -1 */
  int64_t max_rows;    /* most rows one sequence can have (0: unbounded) */
  /* Added after ABI 1's first release (read only when size covers it; 0 otherwise): */
  int32_t augments;    /* 1: augment() transforms rows under these options (training only) */
  int32_t reserved;
  /* Added after augments (read only when size covers it; 0 otherwise): */
  int32_t has_mask;    /* TSR_ROWS_IDS: 1 when the vocabulary has a mask token ([MASK], <mask>) */
  int32_t mask_id;     /* its id when has_mask (masked-LM training replaces chosen rows by it) */
} tsr_encoder_info;

/* ---- Items in, rows out -------------------------------------------------------------------- */
typedef struct tsr_item {
  uint32_t size;
  const char* id;           /* stable id: "photos/cat.jpg", "uniprot.fasta#12", "lines.txt:17" */
  const char* source;       /* the file it came from, for messages; NULL for inline text */
  const uint8_t* data;      /* a whole file (TSR_INPUT_FILE) or UTF-8 text (TSR_INPUT_TEXT) */
  size_t n_data;
  uint64_t source_offset;   /* where data starts in source, in bytes */
  uint32_t source_line;     /* text items: their first line in source (1-based); else 0 */
} tsr_item;

/* The role of a row. Only grows. */
typedef enum tsr_role {
  TSR_ROLE_CONTENT = 0,
  TSR_ROLE_CLS = 1,   /* a summary row; for feature rows its values are ignored: the model's
                         feature stem puts its learned CLS vector there */
  TSR_ROLE_EOS = 2,
  TSR_ROLE_PAD = 3,
  TSR_ROLE_MASK = 4,
  TSR_ROLE_SEP = 5,
  TSR_ROLE_BOS = 6,
  TSR_ROLE_UNK = 7    /* content the vocabulary could not represent */
} tsr_role;

/* Where a row came from, in units a person can point at. Only grows. */
typedef enum tsr_provenance_kind {
  TSR_PROV_NONE = 0,      /* special rows (CLS, EOS, ...) */
  TSR_PROV_BYTES = 1,     /* [x0, x1): byte offsets in the item's text (UTF-8) */
  TSR_PROV_PIXELS = 2,    /* [x0, x1) × [y0, y1): a box in the decoded input image, in its pixels,
                             after EXIF orientation, before any resize or crop */
  TSR_PROV_TIME_FREQ = 3, /* [x0, x1) seconds × [y0, y1) mel bands (band index, 0 = lowest) */
  TSR_PROV_RESIDUE = 4    /* [x0, x1): residue indices in the sequence, 0-based */
} tsr_provenance_kind;

typedef struct tsr_provenance {
  uint32_t kind; /* a tsr_provenance_kind */
  uint32_t reserved;
  double x0, x1, y0, y1;
} tsr_provenance;

/* An optional picture of the item for attention heatmaps: the image itself, or a spectrogram.
 * Row-major, 8-bit, 1 (grey) or 3 (RGB) channels. It covers provenance coordinates
 * [x0, x1) × [y0, y1) (pixels, or seconds × mel bands with y0 = the lowest band at the bottom). */
typedef struct tsr_picture {
  uint32_t size;
  uint32_t width, height, channels; /* 0 width: no picture */
  const uint8_t* pixels;
  double x0, x1, y0, y1;
} tsr_picture;

/* One sequence of rows. A plugin may produce several per item (overlapping windows). */
typedef struct tsr_rows {
  uint32_t size;
  uint32_t kind;          /* a tsr_rows_kind, as the encoder info says */
  uint32_t n_rows;
  uint32_t width;         /* TSR_ROWS_FEATURES: values per row */
  const int32_t* ids;     /* TSR_ROWS_IDS: n_rows ids */
  const float* features;  /* TSR_ROWS_FEATURES: n_rows × width, row-major */
  const int32_t* positions; /* n_rows × 2: (index, -1) for 1-D rows; (grid row, grid col) for 2-D */
  const uint8_t* roles;     /* n_rows tsr_role */
  const tsr_provenance* provenance; /* n_rows */
  uint32_t grid_rows, grid_cols;    /* the patch grid of 2-D rows; 0, 0 for 1-D */
  tsr_picture picture;
  const char* label;      /* a suffix naming this sequence among several ("w0", "w1"), or "" */
} tsr_rows;

typedef struct tsr_encoding {
  uint32_t size;
  uint32_t n_sequences;
  const tsr_rows* sequences;
} tsr_encoding;

/* ---- The table ------------------------------------------------------------------------------ */
typedef struct tsr_plugin {
  uint32_t size;        /* sizeof(tsr_plugin) as the plugin was compiled */
  uint32_t abi_version; /* TSR_PLUGIN_ABI_VERSION as the plugin was compiled */
  const tsr_plugin_info* info;

  int32_t (*create)(const tsr_option_value* options, uint32_t n_options, void** encoder, tsr_error* error);
  void (*destroy)(void* encoder);
  int32_t (*describe)(void* encoder, tsr_encoder_info* info, tsr_error* error);
  int32_t (*encode)(void* encoder, const tsr_item* item, tsr_encoding** encoding, tsr_error* error);
  void (*release)(void* encoder, tsr_encoding* encoding);
  /* ids -> UTF-8 text into text[0, capacity); *length = bytes needed (without the NUL). When
   * capacity is too small, the call returns TSR_OUT_OF_RANGE and the host calls again.
   * TSR_UNSUPPORTED for modalities without text. */
  int32_t (*decode)(void* encoder, const int32_t* ids, size_t n_ids, char* text, size_t capacity, size_t* length,
                    tsr_error* error);
  /* Added after ABI 1's first release: the host reads it only when `size` covers it, and a NULL
   * entry means the modality has no augmentation.
   * Training only: a seeded random transform of one sequence this encoder produced (the image
   * plugin's shifted crop with padding and its flips, for example). `rows` is that sequence as
   * encode() gave it (roles, positions, grid and its features); the plugin writes the transformed
   * n_rows x width feature values to `features` (never aliasing rows->features). The same (rows,
   * seed) gives the same values on every machine and thread count. TSR_UNSUPPORTED when the
   * encoder's options switch augmentation off (describe()'s `augments` is 0). */
  int32_t (*augment)(void* encoder, const tsr_rows* rows, uint64_t seed, float* features, tsr_error* error);
} tsr_plugin;

typedef const tsr_plugin* (*tsr_plugin_entry_fn)(uint32_t host_abi_version);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TESSERA_PLUGIN_H */
