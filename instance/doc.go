// Package instance is what runs inside an inference instance process: the Service that serves
// the contract (tts.Instance) over one loaded model, and the Family interface that each kind of
// model implements. The families live in their own packages (staged, piper); the batching
// scheduler in engine, the ONNX Runtime binding in ort.
package instance
