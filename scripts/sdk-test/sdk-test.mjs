// Drives voxmux with the official OpenAI Node SDK, used as its documentation shows with only the
// base URL changed. Usage: node sdk-test.mjs BASE_URL OUT_DIR
// The API key comes from OPENAI_API_KEY, as the SDK reads it by default. For every
// response_format it writes three files to OUT_DIR: the whole response (speech.create, then
// arrayBuffer), the streamed body (.asResponse(), piped to a file) and the audio carried by SSE
// events (stream_format: "sse"), and lists them in OUT_DIR/results.json for the Go test, which
// decodes each with ffmpeg.
import fs from "node:fs";
import path from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import OpenAI from "openai";

const [baseURL, outDir] = process.argv.slice(2);
if (!baseURL || !outDir) {
  console.error("usage: node sdk-test.mjs BASE_URL OUT_DIR");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });

const client = new OpenAI({ baseURL });
const input = "The quick brown fox jumps over the lazy dog.";
const formats = ["mp3", "opus", "aac", "flac", "wav", "pcm"];
const results = { files: [], models: [], errors: {} };

function fail(msg) {
  console.error("sdk-test: " + msg);
  process.exit(1);
}

// Whole responses, as the text-to-speech guide shows.
for (const format of formats) {
  const speech = await client.audio.speech.create({
    model: "gpt-4o-mini-tts",
    voice: "coral",
    input,
    instructions: "Speak in a cheerful and positive tone.",
    response_format: format,
  });
  const file = path.join(outDir, `speech.${format}`);
  const buffer = Buffer.from(await speech.arrayBuffer());
  await fs.promises.writeFile(file, buffer);
  results.files.push({ format, mode: "whole", file, bytes: buffer.length, contentType: speech.headers.get("content-type") });
}

// Streamed to a file as it arrives, through the raw Response (.asResponse()).
for (const format of formats) {
  const response = await client.audio.speech
    .create({ model: "tts-1", voice: { id: "default" }, input, response_format: format })
    .asResponse();
  const file = path.join(outDir, `stream.${format}`);
  await pipeline(Readable.fromWeb(response.body), fs.createWriteStream(file));
  results.files.push({ format, mode: "stream", file, bytes: fs.statSync(file).size, contentType: response.headers.get("content-type") });
}

// stream_format: "sse": speech.audio.delta events carry base64 audio, speech.audio.done the usage.
for (const format of formats) {
  const response = await client.audio.speech
    .create({ model: "gpt-4o-mini-tts", voice: "alloy", input, response_format: format, stream_format: "sse" })
    .asResponse();
  const chunks = [];
  let usage = null;
  let buf = "";
  const decoder = new TextDecoder();
  const handle = (event) => {
    const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
    if (!data) return;
    const ev = JSON.parse(data);
    if (ev.type === "speech.audio.delta") chunks.push(Buffer.from(ev.audio, "base64"));
    else if (ev.type === "speech.audio.done") usage = ev.usage;
    else fail(`${format}: unexpected SSE event ${data.slice(0, 200)}`);
  };
  for await (const part of response.body) {
    buf += decoder.decode(part, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      handle(buf.slice(0, i));
      buf = buf.slice(i + 2);
    }
  }
  if (!usage) fail(`${format}: no speech.audio.done event`);
  const file = path.join(outDir, `sse.${format}`);
  const audio = Buffer.concat(chunks);
  await fs.promises.writeFile(file, audio);
  results.files.push({ format, mode: "sse", file, bytes: audio.length, contentType: response.headers.get("content-type"), usage, deltas: chunks.length });
}

// The models list, and errors as the SDK's typed exceptions.
for await (const model of client.models.list()) results.models.push(model.id);
try {
  await client.audio.speech.create({ model: "tts-1", voice: "nobody", input });
  fail("an unknown voice was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.BadRequestError)) throw e;
  results.errors.bad_request = { status: e.status, type: e.type, param: e.param };
}
try {
  await new OpenAI({ baseURL, apiKey: "sk-wrong" }).audio.speech.create({ model: "tts-1", voice: "alloy", input });
  fail("a wrong API key was accepted");
} catch (e) {
  if (!(e instanceof OpenAI.AuthenticationError)) throw e;
  results.errors.authentication = { status: e.status, type: e.type, code: e.code };
}

await fs.promises.writeFile(path.join(outDir, "results.json"), JSON.stringify(results, null, 2));
console.log(`sdk-test: ${results.files.length} files written to ${outDir}`);
