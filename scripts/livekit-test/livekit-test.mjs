// LiveKit Agents' ElevenLabs TTS plugin, configured as its documentation shows with only the base
// URL pointed at voxmux, speaks a conversation of three turns streamed a word at a time (as an
// LLM's tokens come); the user barges in on the second. Usage:
//   node livekit-test.mjs BASE_URL VOICE_ID OUT_DIR     (the key in ELEVEN_API_KEY, as the plugin reads it)
// OUT_DIR/results.json has each turn's audio seconds, frames, timed words and whether it ended;
// OUT_DIR/turn-N.wav each turn's audio (16-bit mono), for a listener or a speech recognizer.
import fs from "node:fs";
import path from "node:path";
import { initializeLogger } from "@livekit/agents";
import * as elevenlabs from "@livekit/agents-plugin-elevenlabs";

const [baseURL, voiceId, outDir] = process.argv.slice(2);
if (!baseURL || !voiceId || !outDir) {
  console.error("usage: node livekit-test.mjs BASE_URL VOICE_ID OUT_DIR");
  process.exit(2);
}
initializeLogger({ pretty: false, level: "warn" });
const rate = 22050;
const tts = new elevenlabs.TTS({ baseURL, voiceId, model: "eleven_flash_v2_5", encoding: `pcm_${rate}` });
const turns = [
  { text: "Hello! I am your assistant. How can I help you today?" },
  { text: "Let me tell you a long story about the sea, the wind, and the ships that sail far away to distant lands.", bargeInAfter: 0.5 },
  { text: "Sorry, you were saying? Go ahead." },
];
const results = [];
const audio = [];
for (const turn of turns) {
  const stream = tts.stream();
  for (const word of turn.text.split(" ")) stream.pushText(word + " ");
  stream.flush();
  stream.endInput();
  const r = { text: turn.text, bargeIn: !!turn.bargeInAfter, seconds: 0, frames: 0, words: [], ended: false };
  const pcm = [];
  for await (const ev of stream) {
    if (typeof ev === "symbol") {
      r.ended = true;
      break;
    }
    if (ev.frame) {
      r.frames++;
      pcm.push(Buffer.from(ev.frame.data.buffer, ev.frame.data.byteOffset, ev.frame.data.byteLength));
      r.seconds += ev.frame.samplesPerChannel / rate;
    }
    for (const w of ev.timedTranscripts ?? []) r.words.push({ text: w.text, start: w.startTime, end: w.endTime });
    if (turn.bargeInAfter && r.seconds >= turn.bargeInAfter) {
      stream.close(); // the user talks: the plugin closes the context
      break;
    }
    if (ev.final) {
      r.ended = true;
      break;
    }
  }
  results.push(r);
  audio.push(Buffer.concat(pcm));
  console.log(`${r.bargeIn ? "barge-in" : "turn"}: ${r.frames} frames, ${r.seconds.toFixed(2)} s, ${r.words.length} timed words`);
}
await tts.close();
fs.mkdirSync(outDir, { recursive: true });
fs.writeFileSync(path.join(outDir, "results.json"), JSON.stringify(results, null, 2));
audio.forEach((data, i) => fs.writeFileSync(path.join(outDir, `turn-${i + 1}.wav`), wav(data)));
process.exit(0);

// wav wraps 16-bit mono PCM at rate in a WAV header.
function wav(data) {
  const h = Buffer.alloc(44);
  h.write("RIFF", 0);
  h.writeUInt32LE(36 + data.length, 4);
  h.write("WAVEfmt ", 8);
  h.writeUInt32LE(16, 16);
  h.writeUInt16LE(1, 20);
  h.writeUInt16LE(1, 22);
  h.writeUInt32LE(rate, 24);
  h.writeUInt32LE(rate * 2, 28);
  h.writeUInt16LE(2, 32);
  h.writeUInt16LE(16, 34);
  h.write("data", 36);
  h.writeUInt32LE(data.length, 40);
  return Buffer.concat([h, data]);
}
