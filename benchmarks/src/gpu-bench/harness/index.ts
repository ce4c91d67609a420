export * from './engine.js';
export * from './flags.js';
export * from './harness.js';
export * from './http.js';
export * from './locate.js';
export * from './parsers.js';
export * from './processes.js';
export * from './sinks.js';
