export { ERROR_CODES, type ErrorCode, HydraError } from './errors.js';
