/*
 * tokenize_cmd.c — `loom tokenize`: text on standard input -> token ids (space-separated, one
 * line), or with --decode ids -> exactly the bytes they stand for (no newline added). The
 * literal text <|endoftext|> is the end-of-text token, and the text of each special token a
 * tokenizer.json declares (Llama 3's <|begin_of_text|>, ...) is that token, as tiktoken with every
 * special token allowed. Ids are printed as they are, so Llama 3's 128256 work here.
 */
#include "cli/cli.h"
#include "loom/data.h"
#include "loom/train.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char tokenizer[LOOM_PATH_MAX];
    int decode;
} tokenize_args;

#define KOPT(...) CLI_OPT(tokenize_args, __VA_ARGS__)

static const cli_opt tokenize_opts[] = {
    CLI_GROUP("run"),
    KOPT("--tokenizer", OPT_STRING, tokenizer,
         "\"bytes\", or a byte-level BPE (GPT-2's, or Llama 3's tokenizer.json): a folder with "
         "vocab.json + merges.txt, tokenizer.json or gpt2_tokenizer.bin (decoding only), or one "
         "of those files (default: none, give one)"),
    KOPT("--decode", OPT_FLAG, decode, "read token ids, write the bytes they decode to"),
};
#define NTOKENIZE ((int)(sizeof tokenize_opts / sizeof tokenize_opts[0]))

/* All of standard input, NUL-terminated (the NUL not counted). */
static loom_status read_stdin(char **data, size_t *size) {
    *data = NULL, *size = 0;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    if (!buf) return loom_fail(LOOM_ERR_NOMEM, "standard input: out of memory");
    for (;;) {
        n += fread(buf + n, 1, cap - n, stdin);
        if (n < cap) break;
        char *grown = realloc(buf, 2 * cap + 1);
        if (!grown) {
            free(buf);
            return loom_fail(LOOM_ERR_NOMEM, "standard input: out of memory");
        }
        buf = grown, cap *= 2;
    }
    if (ferror(stdin)) {
        free(buf);
        return loom_fail(LOOM_ERR_IO, "standard input: read failed");
    }
    buf[n] = '\0';
    *data = buf, *size = n;
    return LOOM_OK;
}

static loom_status encode_stdin(const loom_tokenizer *tok) {
    char *text;
    size_t n, count = 0;
    loom_status st = read_stdin(&text, &n);
    if (st != LOOM_OK || !text) return st;
    uint32_t *tokens = malloc((n ? n : 1) * sizeof *tokens);
    if (!tokens) {
        free(text);
        return loom_fail(LOOM_ERR_NOMEM, "tokenize: out of memory for %zu tokens", n);
    }
    loom_token_encoder *enc = NULL;
    st = loom_token_encoder_create(&enc, tok);
    if (st == LOOM_OK) st = loom_token_encoder_run_wide(enc, text, n, 1, tokens, &count);
    for (size_t i = 0; st == LOOM_OK && i < count; i++) {
        printf(i ? " %u" : "%u", (unsigned)tokens[i]);
    }
    if (st == LOOM_OK) putchar('\n');
    loom_token_encoder_free(enc);
    free(tokens), free(text);
    return st;
}

/* Ids separated by white space. A NUL byte is refused by its position before anything is
 * written (the scan below would take it for the end of the input). */
static loom_status decode_stdin(const loom_tokenizer *tok) {
    char *buf;
    size_t n;
    loom_status st = read_stdin(&buf, &n);
    if (st != LOOM_OK || !buf) return st;
    const char *nul = memchr(buf, '\0', n);
    if (nul) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "standard input: byte %zu is a NUL byte: expected token ids separated by "
                       "white space",
                       (size_t)(nul - buf));
        free(buf);
        return st;
    }
    int vocab = loom_tokenizer_vocab_size(tok);
    size_t index = 0;
    for (char *p = buf; st == LOOM_OK;) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        const char *bytes = NULL;
        size_t length = 0;
        int bad_text = end == p || errno ||
                       (*end && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r');
        if (!bad_text && id >= 0 && id < vocab)
            length = loom_tokenizer_token_bytes(tok, (int)id, &bytes);
        if (bad_text || !bytes) {
            int shown = 0;
            while (p[shown] && p[shown] != ' ' && p[shown] != '\n' && shown < 20) shown++;
            st = loom_fail(LOOM_ERR_INPUT,
                           "standard input: token %zu: expected an id of the tokenizer (0..%d), "
                           "got \"%.*s\"",
                           index, vocab - 1, shown, p);
            break;
        }
        fwrite(bytes, 1, length, stdout);
        p = end;
        index++;
    }
    free(buf);
    return st;
}

int cmd_tokenize(int argc, char **argv) {
    const char *usage = "usage: loom tokenize --tokenizer DIR_OR_FILE [--decode] <IN >OUT";
    if (cli_find_flag(argc, argv, "--help") >= 0 || cli_find_flag(argc, argv, "-h") >= 0) {
        cli_print_help(usage, tokenize_opts, NTOKENIZE, NULL);
        return 0;
    }
    tokenize_args args;
    memset(&args, 0, sizeof args);
    loom_status st = cli_parse_flags(&args, tokenize_opts, NTOKENIZE, argc, argv, 2, NULL);
    if (st == LOOM_OK && !args.tokenizer[0]) {
        st = loom_fail(LOOM_ERR_INPUT,
                       "--tokenizer: expected \"bytes\" or a tokenizer folder or "
                       "file (%s)",
                       usage);
    }
    loom_tokenizer *tok = NULL;
    if (st == LOOM_OK) st = loom_tokenizer_open(&tok, args.tokenizer);
    if (st == LOOM_OK) st = args.decode ? decode_stdin(tok) : encode_stdin(tok);
    loom_tokenizer_free(tok);
    if (fflush(stdout) != 0 && st == LOOM_OK) {
        st = loom_fail(LOOM_ERR_IO, "standard output: write failed");
    }
    return st == LOOM_OK ? 0 : cli_fail(st);
}
