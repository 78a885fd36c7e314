// Runs an `export-hf` folder in Transformers.js (Node), for tests/e2e/test_transformers_js.py.
// Usage: node transformers_js_runner.mjs <npm prefix holding @huggingface/transformers> <job.json> <result.json>
// The job names the folder, its task, and what to run: "strings" to encode with the folder's
// tokenizer, "prompts" (token ids) to generate from greedily, one by one and as one left-padded
// batch ("batch"), "inputs" (tensors) for one forward pass, "pipeline" (its "texts", or audio "clips", run
// through `pipeline(task, folder)` with its "options"), "speech" (audio clips transcribed by the
// folder's processor and `generate`, and by the speech recognition pipeline), "audio" (clips one by one
// through the folder's processor and a CTC or audio classification model), or "detect" (image files one by one
// through `pipeline("object-detection", folder)` and the folder's processor), or "image_text" (prompts with image files (and audio clips) through the folder's
// processor, with chat messages through its chat template, or processed inputs as given, and an image-text-to-text
// model's `generate`, greedily or with the prompt's generate options; the processor's outputs returned), or "audio_text" (processed
// inputs as given to an audio-text-to-text model's `generate`; a prompt's "chunks", tensors given to a streaming
// model's `generate` as its `input_features` iterable, one chunk per element), or "spectrogram" (token ids
// with a speaker embedding through a text-to-spectrogram model's `generate_speech` and a vocoder folder), or "speak" (texts
// through the `text-to-audio` pipeline with a speaker embedding, its vocoder set from a folder). The folder is loaded as written:
// from_pretrained(folder, { local_files_only: true }), with the job's "dtype" where it names one
// (the file suffix Transformers.js loads, in place of the config's).
import { createRequire } from 'node:module';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';

const [prefix, jobPath, resultPath] = process.argv.slice(2);
const transformers = createRequire(join(prefix, 'package.json'))('@huggingface/transformers');
const {
    AutoTokenizer, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoModelForImageClassification,
    AutoModelForSequenceClassification, AutoModelForTokenClassification, AutoModelForQuestionAnswering, AutoModelForMaskedLM,
    AutoModelForObjectDetection, AutoModelForSemanticSegmentation, AutoModelForDepthEstimation, AutoModelForCTC,
    AutoModelForAudioClassification, AutoModelForSpeechSeq2Seq, AutoModelForImageTextToText, AutoModelForAudioTextToText, AutoModelForTextToSpectrogram, AutoProcessor, RawImage, Tensor, pipeline,
} = transformers;

const job = JSON.parse(readFileSync(jobPath, 'utf8'));
const options = { local_files_only: true, ...(job.dtype ? { dtype: job.dtype } : {}) };
const classes = {
    'text-generation': AutoModelForCausalLM,
    'text2text-generation': AutoModelForSeq2SeqLM,
    'feature-extraction': AutoModel,
    'image-classification': AutoModelForImageClassification,
    'text-classification': AutoModelForSequenceClassification,
    'token-classification': AutoModelForTokenClassification,
    'question-answering': AutoModelForQuestionAnswering,
    'fill-mask': AutoModelForMaskedLM,
    'object-detection': AutoModelForObjectDetection,
    'image-segmentation': AutoModelForSemanticSegmentation,
    'depth-estimation': AutoModelForDepthEstimation,
    'automatic-speech-recognition': AutoModelForCTC,
    'audio-classification': AutoModelForAudioClassification,
    'zero-shot-image-classification': AutoModel,
};

function int64(rows) {
    return new Tensor('int64', BigInt64Array.from(rows.flat().map(BigInt)), [rows.length, rows[0].length]);
}

function plain(tensor) {
    return { dims: tensor.dims, data: Array.from(tensor.data, Number) };
}

function ones(rows) {
    return rows.map((row) => row.map(() => 1));
}

function tensors(specs) {
    const feed = {};
    for (const [name, { type, dims, data }] of Object.entries(specs)) {
        feed[name] = type === 'int64' ? new Tensor('int64', BigInt64Array.from(data.map(BigInt)), dims)
            : type === 'bool' ? new Tensor('bool', Uint8Array.from(data.map(Number)), dims)
            : new Tensor('float32', Float32Array.from(data), dims);
    }
    return feed;
}

async function generate(model, ids, mask, newTokens) {
    const inputs = job.task === 'text2text-generation' ? { inputs: int64(ids) } : { input_ids: int64(ids) };
    const output = await model.generate({
        ...inputs, attention_mask: int64(mask), max_new_tokens: newTokens, min_new_tokens: newTokens, do_sample: false,
    });
    const { dims, data } = plain(output);
    const rows = [];
    for (let row = 0; row < dims[0]; ++row) {
        const sequence = data.slice(row * dims[1], (row + 1) * dims[1]);
        // a decoder-only model returns the prompt too; an encoder-decoder its decoder start token
        rows.push(job.task === 'text2text-generation' ? sequence.slice(1) : sequence.slice(ids[row].length));
    }
    return rows;
}

// the processors whose call takes the images first (`_call(images, text = null, kwargs = {})`); the others take the text
const IMAGES_FIRST = new Set(['PaliGemmaProcessor', 'Florence2Processor', 'Lfm2VlProcessor', 'Lfm3VlProcessor', 'PixtralProcessor',
    'LlavaProcessor']);

async function processed(processor, text, images, audio) {
    if (audio) {  // processors of images and audio (Gemma3nProcessor): `_call(text, images = null, audio = null)`
        return processor(text, images, audio);
    }
    return IMAGES_FIRST.has(processor.constructor.name) ? processor(images, text) : processor(text, images);
}

const result = {};
if (job.strings) {
    const tokenizer = await AutoTokenizer.from_pretrained(job.folder, options);
    result.encoded = job.strings.map((text) => tokenizer.encode(text));
}
if (job.prompts || job.inputs) {
    const model = await classes[job.task].from_pretrained(job.folder, options);
    if (job.prompts) {
        result.generated = [];
        for (const prompt of job.prompts) {
            result.generated.push((await generate(model, [prompt], ones([prompt]), job.new_tokens))[0]);
        }
        if (job.batch) {
            result.batch_generated = await generate(model, job.batch.input_ids, job.batch.attention_mask, job.new_tokens);
        }
    }
    if (job.inputs) {
        const outputs = await model(tensors(job.inputs));
        result.outputs = Object.fromEntries(job.outputs.map((name) => [name, plain(outputs[name])]));
    }
}
if (job.pipeline) {
    const run = await pipeline(job.task, job.folder, options);
    // audio clips (lists of samples) as Float32Array, as the audio pipelines take a batch of clips
    const given = job.pipeline.clips ? job.pipeline.clips.map((samples) => Float32Array.from(samples)) : job.pipeline.texts;
    result.pipeline = await run(given, job.pipeline.options ?? {});
    // text-to-audio gives RawAudio objects: their samples as a plain list, with the sampling rate
    const audio = (item) => (item?.audio instanceof Float32Array
        ? { audio: Array.from(item.audio), sampling_rate: item.sampling_rate } : item);
    result.pipeline = Array.isArray(result.pipeline) ? result.pipeline.map(audio) : audio(result.pipeline);
}
if (job.detect) {
    // each image file alone through `pipeline("object-detection", folder)` (its batch of one) with the
    // job's options, and through the folder's processor: the pixel values that pipeline fed the model
    const run = await pipeline('object-detection', job.folder, options);
    const processor = await AutoProcessor.from_pretrained(job.folder, options);
    result.detect = [];
    for (const path of job.detect.images) {
        const { pixel_values } = await processor(await RawImage.read(path));
        result.detect.push({ pixel_values: plain(pixel_values), detections: await run(path, job.detect.options ?? {}) });
    }
}
if (job.audio) {
    // each clip alone through the folder's processor and model, as the speech recognition (CTC) and
    // audio classification pipelines run a batch of clips: the processor's input names, the outputs
    const model = await classes[job.task].from_pretrained(job.folder, options);
    const processor = await AutoProcessor.from_pretrained(job.folder, options);
    result.audio = [];
    for (const samples of job.audio.clips) {
        const inputs = await processor(Float32Array.from(samples));
        const outputs = await model(inputs);
        result.audio.push({ inputs: Object.keys(inputs).sort(),
                            outputs: Object.fromEntries(job.audio.outputs.map((name) => [name, plain(outputs[name])])) });
    }
}
if (job.speech) {
    // each clip as a user transcribes it: the folder's processor (its own features, or the
    // waveform as is), then generate with the job's options (language, task, max_new_tokens);
    // the tokens after the prompt: Whisper's that generate builds from them (<|startoftranscript|>,
    // language, task, <|notimestamps|>), another model's decoder start token. With "pipeline",
    // the clips through `pipeline("automatic-speech-recognition", folder)` too: their texts.
    // A prompt the job gives (`decoder_input_ids` in its options: Cohere ASR's) is sent as is
    // and skipped; "prompt_ids" is the prompt the folder's processor builds, where it builds
    // one (CohereAsrProcessor.get_decoder_prompt_ids for the job's "language"); the pipeline
    // runs with "pipeline_options" where given (it builds that prompt itself).
    const { clips, options: speechOptions, pipeline_options: pipelineOptions, language } = job.speech;
    const processor = await AutoProcessor.from_pretrained(job.folder, options);
    const model = await AutoModelForSpeechSeq2Seq.from_pretrained(job.folder, options);
    const prompt = model._retrieve_init_tokens ? model._retrieve_init_tokens(model._prepare_generation_config(null, speechOptions))
        : speechOptions.decoder_input_ids ?? null;
    const promptIds = processor.get_decoder_prompt_ids ? processor.get_decoder_prompt_ids(language) : null;
    result.speech = { prompt, prompt_ids: promptIds, processor: processor.constructor.name, features: [], generated: [] };
    for (const samples of clips) {
        const inputs = await processor(Float32Array.from(samples));
        result.speech.features.push(plain(inputs[model.main_input_name]));
        const output = plain(await model.generate({ ...inputs, ...speechOptions }));
        result.speech.generated.push(output.data.slice(prompt ? prompt.length : 1));
    }
    if (job.speech.pipeline) {
        const run = await pipeline('automatic-speech-recognition', job.folder, options);
        result.speech.texts = [];
        for (const samples of clips) {
            result.speech.texts.push((await run(Float32Array.from(samples), pipelineOptions ?? speechOptions)).text);
        }
    }
}
if (job.image_text) {
    const { prompts, new_tokens: newTokens } = job.image_text;
    const processor = prompts.some((prompt) => prompt.images || prompt.audio)
        ? await AutoProcessor.from_pretrained(job.folder, options) : null;
    const model = await AutoModelForImageTextToText.from_pretrained(job.folder, options);
    result.image_text = [];
    for (const { text, messages, images = [], audio, inputs: given, options: search } of prompts) {
        // a prompt's text (or chat messages through the folder's chat template), image files and audio clips
        // (samples, one clip) through the processor, or its processed inputs as given
        const opened = given ? [] : await Promise.all(images.map((path) => RawImage.read(path)));
        const prompt = messages ? processor.apply_chat_template(messages, { add_generation_prompt: true }) : text;
        const chosen = opened.length === 1 ? opened[0] : (opened.length === 0 && audio ? null : opened);
        const inputs = given ? tensors(given)
            : await processed(processor, prompt, chosen, audio ? Float32Array.from(audio) : null);
        // a prompt's "options" (generate's keyword arguments) in place of greedy search of newTokens tokens exactly:
        // `{}` runs the folder's generation_config.json as written
        const output = plain(await model.generate({
            ...inputs, max_new_tokens: newTokens, ...(search ?? { min_new_tokens: newTokens, do_sample: false }),
        }));
        // an encoder-decoder's output is the decoder's tokens, after its start token
        const [rows, promptLength] = model.config.is_encoder_decoder ? [inputs.input_ids.dims[0], 1] : inputs.input_ids.dims;
        const width = output.data.length / rows;
        result.image_text.push({
            input_ids: plain(inputs.input_ids).data, pixel_values: inputs.pixel_values ? plain(inputs.pixel_values) : null,
            // every tensor the processor gave (or the prompt's), with its type: the inputs to give transformers too
            processed: Object.fromEntries(Object.entries(inputs).filter(([, value]) => value instanceof Tensor)
                .map(([name, value]) => [name, { type: value.type, ...plain(value) }])),
            generated: output.data.slice(promptLength, width),
            // the prompt the chat template gave
            prompt: messages ? prompt : null,
            // each sequence's tokens after the prompt (a batch's rows)
            generated_rows: Array.from({ length: rows }, (_, row) => output.data.slice(row * width + promptLength, (row + 1) * width)),
        });
    }
}
if (job.audio_text) {
    // each prompt's processed inputs (ids and audio) as given; the tokens after the prompt
    const { prompts, new_tokens: newTokens } = job.audio_text;
    const model = await AutoModelForAudioTextToText.from_pretrained(job.folder, options);
    result.audio_text = [];
    for (const { chunks, ...given } of prompts) {
        const inputs = tensors(given);
        if (chunks) {
            inputs.input_features = chunks.map((chunk) => tensors({ chunk }).chunk);
        }
        const output = plain(await model.generate({
            ...inputs, max_new_tokens: newTokens, min_new_tokens: newTokens, do_sample: false,
        }));
        result.audio_text.push(output.data.slice(inputs.input_ids.dims[1]));
    }
}
if (job.spectrogram) {
    // each text's token ids with its speaker embedding through a text-to-spectrogram model's
    // generate_speech, with the vocoder loaded from the folder it names (as a user sets the
    // text-to-audio pipeline's `vocoder`): the spectrogram and the waveform
    const { texts, speaker_embeddings: speakers, vocoder: vocoderFolder } = job.spectrogram;
    const model = await AutoModelForTextToSpectrogram.from_pretrained(job.folder, options);
    const vocoder = await AutoModel.from_pretrained(vocoderFolder, options);
    result.spectrogram = [];
    for (const ids of texts) {
        const speaker = new Tensor('float32', Float32Array.from(speakers), [1, speakers.length]);
        const { spectrogram, waveform } = await model.generate_speech(int64([ids]), speaker, { vocoder });
        result.spectrogram.push({ spectrogram: plain(spectrogram), waveform: plain(waveform),
                                  vocoder: vocoder.constructor.name });
    }
}
if (job.speak) {
    // the text-to-audio pipeline on each text, with its vocoder and processor set on it as the
    // guide says (pipeline() takes no vocoder option, and loads no processor for a task of text
    // input, without which the pipeline does not take the text-to-spectrogram path): the samples
    // and the sampling rate
    const { texts, speaker_embeddings: speakers, vocoder: vocoderFolder } = job.speak;
    const speak = await pipeline('text-to-audio', job.folder, options);
    speak.vocoder = await AutoModel.from_pretrained(vocoderFolder, options);
    speak.processor = await AutoProcessor.from_pretrained(job.folder, options);
    result.speak = [];
    for (const text of texts) {
        const { audio, sampling_rate } = await speak(text, { speaker_embeddings: Float32Array.from(speakers) });
        result.speak.push({ audio: Array.from(audio), sampling_rate });
    }
}
writeFileSync(resultPath, JSON.stringify(result));
