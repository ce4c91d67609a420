// LD_PRELOADed into upstream tools by the tests that read their printed output (llama-embedding):
// common_log's worker thread is left running at exit (llama.cpp leaks the logger on purpose), so the
// last queued lines of a long print were lost; joining it at exit writes them all.
struct common_log;
common_log * common_log_main();
void common_log_pause(common_log * log);

__attribute__((destructor)) static void hydra_log_flush() {
    common_log_pause(common_log_main());
}
