// Builds the web UI into one folder the RestServer serves at `/`: index.html, app.js (bundled with its npm
// dependencies by esbuild) and app.css. Usage: node build.mjs [--outdir DIR] (default: dist).
import * as esbuild from "esbuild";
import { copyFile, mkdir } from "node:fs/promises";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const i = process.argv.indexOf("--outdir");
const outdir = path.resolve(i > 0 ? process.argv[i + 1] : path.join(here, "dist"));

await mkdir(outdir, { recursive: true });
await esbuild.build({
  entryPoints: [path.join(here, "src/app.js")],
  bundle: true,
  minify: true,
  sourcemap: false,
  format: "esm",
  target: "es2020",
  outfile: path.join(outdir, "app.js"),
  logLevel: "warning",
});
await copyFile(path.join(here, "src/index.html"), path.join(outdir, "index.html"));
await copyFile(path.join(here, "src/app.css"), path.join(outdir, "app.css"));
console.log(`web UI built into ${outdir}`);
