// A SentencePiece-style ("llama") vocabulary built from real text pieces. llama.cpp's SPM
// tokenizer starts from single characters and merges adjacent pairs whose concatenation is a
// token, best score first, falling back to <0xNN> byte tokens for anything unknown; so every piece
// is added after all of its prefixes, which keeps each word reachable through merges.

/** llama_token_type values (gguf-py TokenType). */
export const TokenType = { NORMAL: 1, UNKNOWN: 2, CONTROL: 3, USER_DEFINED: 4, UNUSED: 5, BYTE: 6 } as const;

export const SPACE = '\u2581'; // ▁, what the SPM tokenizer turns spaces into

export const UNK_ID = 0;
export const BOS_ID = 1;
export const EOS_ID = 2;
export const IM_START = '<|im_start|>';
export const IM_END = '<|im_end|>';
export const IM_START_ID = 259;
export const IM_END_ID = 260;

/** The chatml template; llama.cpp's built-in detection maps anything with <|im_start|> to chatml. */
export const CHATML_TEMPLATE =
  "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/**
 * A Qwen 2.5-style template with tool support (tools listed in the system turn, assistant
 * `<tool_call>` JSON, `role: "tool"` results as `<tool_response>`), for `chat: 'tools'` models.
 * Without tools and a system message it renders exactly what {@link CHATML_TEMPLATE} renders.
 */
export const TOOLS_TEMPLATE = String.raw`{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
`;

const COMMON_WORDS =
  `the of and to a in is it you that he was for on are with as I his they be at one have hello world
this from or had by hot word but what some we can out other were all there when up use your how said an
each she which do their time if will way about many then them write would like so these her long make
thing see him two has look more day could go come did number sound no most people my over know water than
call first who may down side been now find any new work part take get place made live where after back
little only round man year came show every good me give our under name very through just form sentence
great think say help low line differ turn cause much mean before move right boy old too same tell does set
three want air well also play small end put home read hand port large spell add even land here must big
high such follow act why ask men change went light kind off need house picture try us again animal point
mother world near build self earth father head stand own page should country found answer school grow
study still learn plant cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night real life few north
open seem together next white children begin got walk example ease paper group always music those both
mark often letter until mile river car feet care second book carry took science eat room friend began idea
fish mountain stop once base hear horse cut sure watch color face wood main enough plain girl usual young
ready above ever red list though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half rock order fire south
problem piece told knew pass since top whole king space heard best hour better true during hundred five
remember step early hold west ground interest reach fast verb sing listen six table travel less morning
ten simple several vowel toward war lay against pattern slow center love person money serve appear road
map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine
note wait plan figure star box noun field rest correct able pound done beauty drive stood contain front
teach week final gave green oh quick develop ocean warm free minute strong special mind behind clear tail
produce fact street inch multiply nothing course stay wheel full force blue object decide surface deep moon
island foot system busy test record boat common gold possible plane stead dry wonder laugh thousand ago ran
check game shape equate miss brought heat snow tire bring yes distant fill east paint language among
model token engine server request hydra llama`
    .split(/\s+/)
    .filter((w) => w.length > 0);

const SUFFIXES = [
  's',
  'es',
  'ed',
  'er',
  'ing',
  'ly',
  'tion',
  'ment',
  'ness',
  'able',
  'al',
  'ity',
  'ous',
  'ive',
];
const PUNCTUATION = `.,!?;:'"-()[]{}/\\@#$%&*+=<>_~\`^|`;
const LOWER = 'abcdefghijklmnopqrstuvwxyz';
const UPPER = LOWER.toUpperCase();
const DIGITS = '0123456789';

export interface Vocabulary {
  tokens: string[];
  scores: Float32Array;
  types: Int32Array;
}

function* rankedPieces(): Generator<string> {
  yield SPACE;
  for (const ch of LOWER + UPPER + DIGITS + PUNCTUATION) yield ch;
  for (const ch of LOWER + UPPER + DIGITS) yield SPACE + ch;
  for (const w of COMMON_WORDS) yield SPACE + w;
  for (const s of SUFFIXES) yield s;
  for (const w of COMMON_WORDS) yield SPACE + w[0]!.toUpperCase() + w.slice(1);
  for (const w of COMMON_WORDS) yield w;
  // Systematic letter strings fill big vocabularies; shorter ones first keeps prefixes present.
  for (let len = 2; len <= 4; len++) {
    const n = LOWER.length ** len;
    for (let i = 0; i < n; i++) {
      let s = '';
      let k = i;
      for (let j = 0; j < len; j++) {
        s = LOWER[k % 26]! + s;
        k = Math.floor(k / 26);
      }
      yield SPACE + s;
      yield s;
    }
  }
}

/**
 * Builds a vocabulary of exactly `size` tokens: <unk>, <s>, </s>, the 256 byte tokens, the two
 * chatml control tokens, then text pieces ranked by usefulness with scores decreasing by rank.
 */
export function buildVocabulary(size: number): Vocabulary {
  const tokens: string[] = ['<unk>', '<s>', '</s>'];
  const types: number[] = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL];
  for (let b = 0; b < 256; b++) {
    tokens.push(`<0x${b.toString(16).toUpperCase().padStart(2, '0')}>`);
    types.push(TokenType.BYTE);
  }
  tokens.push(IM_START, IM_END);
  types.push(TokenType.CONTROL, TokenType.CONTROL);
  if (size < tokens.length + 100) {
    throw new RangeError(`vocabulary size ${size} is too small (needs at least ${tokens.length + 100})`);
  }
  const seen = new Set(tokens);
  const add = (piece: string): void => {
    if (seen.has(piece)) return;
    seen.add(piece);
    tokens.push(piece);
    types.push(TokenType.NORMAL);
  };
  for (const piece of rankedPieces()) {
    if (tokens.length >= size) break;
    // Add missing prefixes first: SPM can only build a piece by merging pieces it already has.
    const chars = [...piece];
    for (let n = 2; n < chars.length && tokens.length < size; n++) add(chars.slice(0, n).join(''));
    if (tokens.length < size) add(piece);
  }
  if (tokens.length !== size) throw new RangeError(`vocabulary size ${size} is too large`);
  const scores = new Float32Array(size);
  const firstPiece = IM_END_ID + 1;
  for (let i = firstPiece; i < size; i++) scores[i] = -(i - firstPiece);
  return { tokens, scores, types: Int32Array.from(types) };
}

export const TOOL_CALL = '<tool_call>';
export const TOOL_CALL_END = '</tool_call>';

/**
 * The vocabulary of a `chat: 'tools'` model: the two last (least ranked, so no other piece's
 * prefix) pieces become `<tool_call>` and `</tool_call>`, user-defined tokens as in Qwen 2.5.
 */
export function withToolCallTokens(vocab: Vocabulary): Vocabulary {
  const n = vocab.tokens.length;
  const tokens = vocab.tokens.slice();
  const types = vocab.types.slice();
  tokens[n - 2] = TOOL_CALL;
  tokens[n - 1] = TOOL_CALL_END;
  types[n - 2] = TokenType.USER_DEFINED;
  types[n - 1] = TokenType.USER_DEFINED;
  return { tokens, scores: vocab.scores, types };
}

/** Qwen 2.5 Coder's fill-in-the-middle tokens, in the order prefix, suffix, middle. */
export const FIM_TOKENS = ['<|fim_prefix|>', '<|fim_suffix|>', '<|fim_middle|>'] as const;

/**
 * The vocabulary of a `fim: true` model: the pieces 5th to 3rd from the end (least ranked, clear
 * of the tool-call tokens) become the {@link FIM_TOKENS} control tokens; returns their ids too.
 */
export function withFimTokens(vocab: Vocabulary): { vocab: Vocabulary; ids: [number, number, number] } {
  const n = vocab.tokens.length;
  const tokens = vocab.tokens.slice();
  const types = vocab.types.slice();
  const ids: [number, number, number] = [n - 5, n - 4, n - 3];
  ids.forEach((id, i) => {
    tokens[id] = FIM_TOKENS[i]!;
    types[id] = TokenType.CONTROL;
  });
  return { vocab: { tokens, scores: vocab.scores, types }, ids };
}
