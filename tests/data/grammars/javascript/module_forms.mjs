import 'reflect-metadata';
import fs, { promises as fsp, constants } from 'node:fs';
import * as path from 'node:path';
import defaultExport, * as everything from './local.mjs';
import { default as renamed, 'string name' as stringName } from './names.mjs';
import {} from './side-effects.mjs';

export const VERSION = '1.2.3';
export let counter = 0;
export var legacy = true, other = false;
export function increment(by = 1) {
  counter += by;
  return counter;
}
export async function readConfig(file) {
  const text = await fsp.readFile(path.resolve(file), 'utf8');
  return JSON.parse(text);
}
export function* ids() {
  let id = 0;
  while (true) yield ++id;
}
export class Store {
  static instance = null;
  static get() {
    return (Store.instance ??= new Store());
  }
}
const a = 1, b = 2;
export { a, b as bee, a as default };
export { join, resolve as resolvePath } from 'node:path';
export * from './reexport.mjs';
export * as utils from './utils.mjs';
export { stringName as 'another name' };

const lazy = await import('./lazy.mjs');
console.log(import.meta.url, fs.existsSync, constants, defaultExport, everything, renamed, lazy);
