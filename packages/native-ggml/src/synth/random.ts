// Fast seeded weight generation. Values come from lookup tables indexed by 16 random bits so that
// one xorshift128 word yields two normally distributed weights without any per-element math.

const f32Scratch = new Float32Array(1);
const u32Scratch = new Uint32Array(f32Scratch.buffer);

/** IEEE float32 to binary16 bits, round to nearest even (as ggml_compute_fp32_to_fp16). */
export function f32ToF16Bits(value: number): number {
  f32Scratch[0] = value;
  const x = u32Scratch[0]!;
  const sign = (x >>> 16) & 0x8000;
  const exp = (x >>> 23) & 0xff;
  let mant = x & 0x7fffff;
  if (exp === 0xff) return sign | 0x7c00 | (mant !== 0 ? 0x200 : 0);
  const e = exp - 127 + 15;
  if (e >= 31) return sign | 0x7c00;
  if (e <= 0) {
    if (e < -10) return sign;
    mant |= 0x800000;
    const shift = 14 - e;
    let h = mant >>> shift;
    const rem = mant & ((1 << shift) - 1);
    const half = 1 << (shift - 1);
    if (rem > half || (rem === half && (h & 1) === 1)) h++;
    return sign | h;
  }
  let h = (e << 10) | (mant >>> 13);
  const rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem === 0x1000 && (h & 1) === 1)) h++;
  return sign | h;
}

/** binary16 bits to a number. */
export function f16BitsToF32(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >>> 10) & 0x1f;
  const mant = h & 0x3ff;
  if (exp === 0) return sign * mant * 2 ** -24;
  if (exp === 31) return mant === 0 ? sign * Number.POSITIVE_INFINITY : Number.NaN;
  return sign * (1 + mant / 1024) * 2 ** (exp - 15);
}

/** Acklam's rational approximation of the standard normal quantile (relative error < 1.2e-9). */
function normalQuantile(p: number): number {
  const a = [
    -39.69683028665376, 220.9460984245205, -275.9285104469687, 138.357751867269, -30.66479806614716,
    2.506628277459239,
  ];
  const b = [
    -54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572,
  ];
  const c = [
    -0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734, 4.374664141464968,
    2.938163982698783,
  ];
  const d = [0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416];
  const lo = 0.02425;
  if (p < lo || p > 1 - lo) {
    const q = Math.sqrt(-2 * Math.log(p < lo ? p : 1 - p));
    const v =
      (((((c[0]! * q + c[1]!) * q + c[2]!) * q + c[3]!) * q + c[4]!) * q + c[5]!) /
      ((((d[0]! * q + d[1]!) * q + d[2]!) * q + d[3]!) * q + 1);
    return p < lo ? v : -v;
  }
  const q = p - 0.5;
  const r = q * q;
  return (
    ((((((a[0]! * r + a[1]!) * r + a[2]!) * r + a[3]!) * r + a[4]!) * r + a[5]!) * q) /
    (((((b[0]! * r + b[1]!) * r + b[2]!) * r + b[3]!) * r + b[4]!) * r + 1)
  );
}

/** Standard deviation of the noise on RMS-norm gains (which are 1 + noise). */
export const NORM_GAIN_STD = 0.02;

/** 65536 values of 1 + N(0, NORM_GAIN_STD), indexed by 16 random bits. */
export const NORM_GAIN_F32 = new Float32Array(65536);
for (let i = 0; i < 65536; i++) NORM_GAIN_F32[i] = 1 + normalQuantile((i + 0.5) / 65536) * NORM_GAIN_STD;

/** 65536 values of −(1 + N(0, NORM_GAIN_STD)): the delta-net decay rates `ssm_a`. */
export const DECAY_F32 = NORM_GAIN_F32.map((v) => -v);

/** Lookup tables and block scales that give weights of one standard deviation. */
export interface WeightTables {
  /** 65536 N(0, std) quantiles. */
  f32: Float32Array;
  /** The same values as f16 bits. */
  f16: Uint16Array;
  /**
   * f16 block scales for uniform random quants: int8 in [-128, 127] has sd 73.9, a q4_0 nibble
   * minus 8 has sd 4.61, so these make the dequantized weights have sd `std` too.
   */
  q8_0Scale: number;
  q4_0Scale: number;
}

const tableCache = new Map<number, WeightTables>();

export function weightTables(std: number): WeightTables {
  let t = tableCache.get(std);
  if (t === undefined) {
    const f32 = new Float32Array(65536);
    const f16 = new Uint16Array(65536);
    for (let i = 0; i < 65536; i++) {
      f32[i] = normalQuantile((i + 0.5) / 65536) * std;
      f16[i] = f32ToF16Bits(f32[i]!);
    }
    t = {
      f32,
      f16,
      q8_0Scale: f32ToF16Bits(std / Math.sqrt((256 * 256 - 1) / 12)),
      q4_0Scale: f32ToF16Bits(std / Math.sqrt((16 * 16 - 1) / 12)),
    };
    tableCache.set(std, t);
  }
  return t;
}

function splitmix32(state: number): [number, number] {
  const s = (state + 0x9e3779b9) | 0;
  let z = s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return [s, (z ^ (z >>> 16)) >>> 0];
}

/** Marsaglia xorshift128: four words of state, period 2^128 - 1, a handful of ops per word. */
export class Xorshift128 {
  #x: number;
  #y: number;
  #z: number;
  #w: number;

  /** Seeds from a user seed and a stream id (the tensor index) through splitmix32. */
  constructor(seed: number, stream: number) {
    let s = (seed ^ Math.imul(stream + 1, 0x27d4eb2d)) | 0;
    let v: number;
    [s, v] = splitmix32(s);
    this.#x = v;
    [s, v] = splitmix32(s);
    this.#y = v;
    [s, v] = splitmix32(s);
    this.#z = v;
    [s, v] = splitmix32(s);
    this.#w = v;
    if ((this.#x | this.#y | this.#z | this.#w) === 0) this.#w = 1;
  }

  /** Fills `out` with random words. */
  fill(out: Uint32Array, count = out.length): void {
    let x = this.#x;
    let y = this.#y;
    let z = this.#z;
    let w = this.#w;
    for (let i = 0; i < count; i++) {
      const t = x ^ (x << 11);
      x = y;
      y = z;
      z = w;
      w = w ^ (w >>> 19) ^ (t ^ (t >>> 8));
      out[i] = w;
    }
    this.#x = x;
    this.#y = y;
    this.#z = z;
    this.#w = w;
  }
}
