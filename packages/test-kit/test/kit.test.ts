import { describe, expect, it } from 'vitest';
import { errorCode, parseMetrics, SseCompletion, waitFor } from '../src/index.js';

describe('test-kit', () => {
  it('waitFor resolves once the check holds and names what timed out', async () => {
    let n = 0;
    await waitFor(() => ++n === 3, 2_000);
    expect(n).toBe(3);
    await expect(waitFor(() => false, 60, 'never')).rejects.toThrow(/^never: not met within 60 ms$/);
    await expect(
      waitFor(() => {
        throw new Error('gone');
      }, 1_000),
    ).rejects.toThrow('gone');
  });

  it('reads SSE split anywhere, with the error event and finish reason', () => {
    const text =
      'data: {"choices":[{"text":"he"}]}\n\ndata: {"choices":[{"text":"llo","finish_reason":"length"}]}\n\n' +
      'data: {"error":{"code":"HYDRA_ERR_SHUTTING_DOWN"}}\n\ndata: [DONE]\n\n';
    let first = 0;
    const sse = new SseCompletion(() => first++);
    for (let i = 0; i < text.length; i += 7) sse.push(text.slice(i, i + 7));
    expect(sse.result()).toEqual({
      text: 'hello',
      finish: 'length',
      error: { code: 'HYDRA_ERR_SHUTTING_DOWN' },
    });
    expect(first).toBe(1);
  });

  it('parses Prometheus text by name and labels', () => {
    const m = parseMetrics('# HELP x\nhydra_slots_busy 2\nhydra_requests_total{code="200"} 7\n');
    expect([...m]).toEqual([
      ['hydra_slots_busy', 2],
      ['hydra_requests_total{code="200"}', 7],
    ]);
  });

  it('errorCode reads the code of what a function throws', () => {
    expect(
      errorCode(() => {
        throw Object.assign(new Error('x'), { code: 'HYDRA_ERR_BAD_ARGUMENT' });
      }),
    ).toBe('HYDRA_ERR_BAD_ARGUMENT');
    expect(errorCode(() => 1)).toBeUndefined();
    expect(
      errorCode(() => {
        throw null;
      }),
    ).toBeUndefined();
  });
});
