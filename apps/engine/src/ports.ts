// The engine's sources and tests take the helper from here; it lives in native-ggml so that the
// suites of packages below the engine use the same one.
export { freeLoopbackPort } from '@hydra-engine/native-ggml';
