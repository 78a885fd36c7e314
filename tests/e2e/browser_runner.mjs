// Runs `export-hf` folders in Transformers.js's web build inside headless Chromium on the
// WebGPU device, for tests/e2e/test_browser_webgpu.py.
// Usage: node browser_runner.mjs <npm prefix holding playwright-core> <npm prefix holding
//        @huggingface/transformers> <chromium executable> <job.json> <result.json>
// The job lists "runs": each names a folder, its task and what to run ("prompts" to generate
// from greedily, one by one and as one left-padded "batch", or "inputs" for one forward pass). The pages, the library, onnxruntime-web's
// files and the folders are served by this script on 127.0.0.1 only; nothing else is reached.
// onnxruntime-web logs verbosely, so the result holds each session's node placements as
// onnxruntime prints them ("placements": the console lines of the log).
import { createRequire } from 'node:module';
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { readFileSync, writeFileSync } from 'node:fs';
import { join, normalize, extname } from 'node:path';

const [playwrightPrefix, transformersPrefix, chromiumPath, jobPath, resultPath] = process.argv.slice(2);
const { chromium } = createRequire(join(playwrightPrefix, 'package.json'))('playwright-core');
const job = JSON.parse(readFileSync(jobPath, 'utf8'));
const modules = join(transformersPrefix, 'node_modules');
const roots = {
    tf: join(modules, '@huggingface', 'transformers', 'dist'),
    ort: join(modules, 'onnxruntime-web', 'dist'),
    models: job.models_root,
};
const types = { '.mjs': 'text/javascript', '.js': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' };

// The web build imports onnxruntime-web and onnxruntime-common by their package names: the
// import map points both at one onnxruntime-web module, so that the library and the runtime
// share one Tensor class.
const page = `<!doctype html><html><head><script type="importmap">
{"imports": {"onnxruntime-web/webgpu": "/ort/ort.webgpu.mjs", "onnxruntime-common": "/ort/ort.webgpu.mjs"}}
</script></head><body>fx2onnx browser test</body></html>`;

const server = createServer(async (request, response) => {
    const path = decodeURIComponent(new URL(request.url, 'http://127.0.0.1').pathname);
    if (path === '/') {
        response.writeHead(200, { 'content-type': 'text/html' });
        response.end(page);
        return;
    }
    const [, root, ...rest] = path.split('/');
    const relative = normalize(rest.join('/'));
    if (!(root in roots) || relative.startsWith('..')) {
        response.writeHead(404);
        response.end();
        return;
    }
    try {
        const body = await readFile(join(roots[root], relative));
        response.writeHead(200, { 'content-type': types[extname(relative)] ?? 'application/octet-stream' });
        response.end(body);
    } catch {
        response.writeHead(404);
        response.end();
    }
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const base = `http://127.0.0.1:${server.address().port}`;

// SwiftShader: Chromium's software Vulkan, a WebGPU adapter on a machine without a GPU
const browser = await chromium.launch({
    executablePath: chromiumPath,
    headless: true,
    args: ['--enable-unsafe-webgpu', '--enable-features=Vulkan', '--use-vulkan=swiftshader',
        '--use-webgpu-adapter=swiftshader', '--disable-vulkan-surface', '--no-sandbox'],
});
const result = { browser: browser.version(), runs: [] };
try {
    const tab = await browser.newPage();
    let lines = [];
    tab.on('console', (message) => lines.push(message.text()));
    tab.on('pageerror', (error) => lines.push(`page error: ${error.message}`));
    await tab.goto(`${base}/`);
    result.adapter = await tab.evaluate(async () => {
        const adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null;
        return adapter ? { architecture: adapter.info.architecture, vendor: adapter.info.vendor } : null;
    });
    for (const run of job.runs) {
        lines = [];
        const outcome = await tab.evaluate(async ({ base, run }) => {
            const tf = await import(`${base}/tf/transformers.web.js`);
            const { env, Tensor, LogLevel } = tf;
            env.allowRemoteModels = false;
            env.allowLocalModels = true;
            env.localModelPath = `${base}/models/`;
            env.useBrowserCache = false;
            env.useWasmCache = false;
            env.logLevel = LogLevel.DEBUG; // onnxruntime's verbose log: the node placements
            env.backends.onnx.wasm.wasmPaths = `${base}/ort/`;
            env.backends.onnx.wasm.numThreads = 1;
            const options = { local_files_only: true, device: 'webgpu', dtype: 'fp32' };
            const int64 = (rows) => new Tensor('int64', BigInt64Array.from(rows.flat().map(BigInt)), [rows.length, rows[0].length]);
            const plain = (tensor) => ({ dims: tensor.dims, data: Array.from(tensor.data, Number) });
            const done = {};
            if (run.prompts) {
                const model = await tf.AutoModelForCausalLM.from_pretrained(run.folder, options);
                done.generated = [];
                for (const prompt of run.prompts) {
                    const output = await model.generate({
                        input_ids: int64([prompt]), attention_mask: int64([prompt.map(() => 1)]),
                        max_new_tokens: run.new_tokens, min_new_tokens: run.new_tokens, do_sample: false,
                    });
                    done.generated.push(plain(output).data.slice(prompt.length));
                }
                if (run.batch) { // one left-padded batch: the padding masked
                    const { input_ids, attention_mask } = run.batch;
                    const output = plain(await model.generate({
                        input_ids: int64(input_ids), attention_mask: int64(attention_mask),
                        max_new_tokens: run.new_tokens, min_new_tokens: run.new_tokens, do_sample: false,
                    }));
                    const width = output.dims[1];
                    done.batch_generated = input_ids.map((row, i) => output.data.slice(i * width + row.length, (i + 1) * width));
                }
                await model.dispose();
            }
            if (run.inputs) {
                const model = await tf.AutoModel.from_pretrained(run.folder, options);
                const feed = Object.fromEntries(Object.entries(run.inputs).map(([name, rows]) => [name, int64(rows)]));
                const outputs = await model(feed);
                done.outputs = Object.fromEntries(run.outputs.map((name) => [name, plain(outputs[name])]));
                await model.dispose();
            }
            return done;
        }, { base, run });
        result.runs.push({ ...outcome, log: lines });
    }
} finally {
    await browser.close();
    server.close();
}
writeFileSync(resultPath, JSON.stringify(result));
