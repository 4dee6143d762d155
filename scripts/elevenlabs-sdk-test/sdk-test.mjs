// Drives voxmux's ElevenLabs API with the official ElevenLabs JavaScript SDK, used as its
// documentation shows with only the base URL changed. Usage: node sdk-test.mjs BASE_URL OUT_DIR
// The API key comes from ELEVENLABS_API_KEY, as the SDK reads it by default. It writes the audio
// of textToSpeech.convert, .stream, .convertWithTimestamps and .streamWithTimestamps to OUT_DIR,
// and OUT_DIR/results.json (files, alignments, voices, models, errors) for the Go test, which
// decodes each file with ffmpeg.
import fs from "node:fs";
import path from "node:path";
import { ElevenLabsClient } from "@elevenlabs/elevenlabs-js";

const [baseUrl, outDir] = process.argv.slice(2);
if (!baseUrl || !outDir) {
  console.error("usage: node sdk-test.mjs BASE_URL OUT_DIR");
  process.exit(2);
}
fs.mkdirSync(outDir, { recursive: true });

const elevenlabs = new ElevenLabsClient({ baseUrl });
const text = "The quick brown fox jumps over the lazy dog.";
const voiceId = "JBFqnCBsd6RMkjVDRZzb"; // ElevenLabs' premade voice of the SDK's examples
const results = { files: [], alignments: [], voices: [], models: [], errors: {} };

async function save(name, stream) {
  const parts = [];
  for await (const part of stream) parts.push(Buffer.from(part));
  const buf = Buffer.concat(parts);
  const file = path.join(outDir, name);
  await fs.promises.writeFile(file, buf);
  return { file, bytes: buf.length };
}

// The whole file, as the README shows, in the default format and in pcm.
for (const outputFormat of ["mp3_44100_128", "pcm_24000", "ulaw_8000"]) {
  const audio = await elevenlabs.textToSpeech.convert(voiceId, { text, modelId: "eleven_multilingual_v2", outputFormat });
  results.files.push({ mode: "convert", format: outputFormat, ...(await save(`convert.${outputFormat}`, audio)) });
}

// Streamed as it is made.
for (const outputFormat of ["mp3_44100_128", "pcm_16000"]) {
  const audio = await elevenlabs.textToSpeech.stream(voiceId, { text, modelId: "eleven_flash_v2_5", outputFormat, voiceSettings: { speed: 1.1 } });
  results.files.push({ mode: "stream", format: outputFormat, ...(await save(`stream.${outputFormat}`, audio)) });
}

// With timestamps: the audio in base64 and each character's times.
{
  const r = await elevenlabs.textToSpeech.convertWithTimestamps(voiceId, { text, modelId: "eleven_turbo_v2_5", outputFormat: "pcm_24000", seed: 7 });
  const buf = Buffer.from(r.audioBase64, "base64");
  const file = path.join(outDir, "timestamps.pcm_24000");
  await fs.promises.writeFile(file, buf);
  results.files.push({ mode: "with-timestamps", format: "pcm_24000", file, bytes: buf.length });
  results.alignments.push({ mode: "with-timestamps", ...r.alignment });
}
{
  const chunks = await elevenlabs.textToSpeech.streamWithTimestamps(voiceId, { text, modelId: "eleven_turbo_v2_5", outputFormat: "pcm_24000" });
  const parts = [];
  const al = { characters: [], characterStartTimesSeconds: [], characterEndTimesSeconds: [] };
  for await (const c of chunks) {
    parts.push(Buffer.from(c.audioBase64, "base64"));
    if (c.alignment) {
      al.characters.push(...c.alignment.characters);
      al.characterStartTimesSeconds.push(...c.alignment.characterStartTimesSeconds);
      al.characterEndTimesSeconds.push(...c.alignment.characterEndTimesSeconds);
    }
  }
  const buf = Buffer.concat(parts);
  const file = path.join(outDir, "stream-timestamps.pcm_24000");
  await fs.promises.writeFile(file, buf);
  results.files.push({ mode: "stream-with-timestamps", format: "pcm_24000", file, bytes: buf.length });
  results.alignments.push({ mode: "stream-with-timestamps", chunks: parts.length, ...al });
}

const voices = await elevenlabs.voices.getAll();
results.voices = voices.voices.map((v) => ({ voiceId: v.voiceId, name: v.name, category: v.category }));
const models = await elevenlabs.models.list();
results.models = models.map((m) => m.modelId);

async function expectError(name, fn) {
  try {
    await fn();
    results.errors[name] = { status: 0 };
  } catch (e) {
    results.errors[name] = { status: e.statusCode ?? -1, body: e.body ?? null };
  }
}
await expectError("unknown_voice", () => elevenlabs.textToSpeech.convert("no-such-voice", { text, modelId: "eleven_multilingual_v2" }));
await expectError("bad_format", () => elevenlabs.textToSpeech.convert(voiceId, { text, outputFormat: "opus_48000_32" }));
await expectError("wrong_key", () =>
  new ElevenLabsClient({ baseUrl, apiKey: "wrong-key", maxRetries: 0 }).textToSpeech.convert(voiceId, { text }),
);

fs.writeFileSync(path.join(outDir, "results.json"), JSON.stringify(results, null, 2));
