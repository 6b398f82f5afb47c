/**
 * The image a sandbox starts from, Beam-style:
 * `new Image({ pythonVersion: "python3.11" }).addPythonPackages(["pandas"])`,
 * `Image.fromRegistry("node:20")`, or a plain name string (`"python"`).
 *
 * It serialises (`toSpec()`) to what `image` on create takes:
 * - nothing set: `undefined`, so the field is left out and the daemon uses
 *   its `default_image`;
 * - only a base (`fromRegistry`, `fromId`, `baseImage`): that string;
 * - anything else: the declarative spec of issue 15,
 *   `{base?, python_version?, python_packages?, system_packages?, commands?, env?, workdir?}`.
 *
 * A daemon without declarative images refuses a spec with a 400
 * (BadRequestError); names and references work everywhere.
 */

/** Beam's spelling of Python versions; the daemon also takes "3.11". */
export const PythonVersion = {
  Python311: "python3.11",
  Python313: "python3.13",
} as const;

export interface ImageSpec {
  base?: string;
  python_version?: string;
  python_packages?: string[];
  system_packages?: string[];
  commands?: string[];
  env?: Record<string, string>;
  workdir?: string;
}

export interface ImageOptions {
  /** Base image: a name (`python`, `busybox`, a filesystem snapshot id) or an OCI reference. */
  baseImage?: string;
  /** `"3.11"` or Beam's `"python3.11"`. */
  pythonVersion?: string;
  pythonPackages?: string[];
  systemPackages?: string[];
  commands?: string[];
  /** Environment of the image, as a map or `["KEY=VALUE", ...]`. */
  envVars?: Record<string, string> | string[];
  workdir?: string;
}

function envOf(values: Record<string, string> | readonly string[] | undefined): Record<string, string> {
  if (values === undefined) return {};
  if (!Array.isArray(values)) return { ...(values as Record<string, string>) };
  const out: Record<string, string> = {};
  for (const item of values) {
    const at = item.indexOf("=");
    if (at <= 0) throw new TypeError(`environment entry ${JSON.stringify(item)} must be KEY=VALUE`);
    out[item.slice(0, at)] = item.slice(at + 1);
  }
  return out;
}

function list(items: string | readonly string[]): string[] {
  return typeof items === "string" ? [items] : [...items];
}

export class Image {
  private base: string | undefined;
  private pythonVersion: string | undefined;
  private readonly pythonPackages: string[] = [];
  private readonly systemPackages: string[] = [];
  private readonly commands: string[] = [];
  private readonly env: Record<string, string> = {};
  private workdir: string | undefined;

  constructor(options: ImageOptions = {}) {
    this.base = options.baseImage;
    this.pythonVersion = options.pythonVersion;
    this.pythonPackages.push(...(options.pythonPackages ?? []));
    this.systemPackages.push(...(options.systemPackages ?? []));
    this.commands.push(...(options.commands ?? []));
    Object.assign(this.env, envOf(options.envVars));
    this.workdir = options.workdir;
  }

  /** An image pulled from an OCI registry (`node:20`, `docker.io/library/python:3.12-slim`). */
  static fromRegistry(reference: string): Image {
    return new Image().fromRegistry(reference);
  }

  /** An image by its daemon-side id or name (a filesystem snapshot from `createImageFromFilesystem()`). */
  static fromId(id: string): Image {
    return new Image({ baseImage: id });
  }

  fromRegistry(reference: string): this {
    this.base = reference;
    return this;
  }

  addPythonVersion(version: string): this {
    this.pythonVersion = version;
    return this;
  }

  addPythonPackages(packages: string | readonly string[]): this {
    this.pythonPackages.push(...list(packages));
    return this;
  }

  addSystemPackages(packages: string | readonly string[]): this {
    this.systemPackages.push(...list(packages));
    return this;
  }

  addCommands(commands: string | readonly string[]): this {
    this.commands.push(...list(commands));
    return this;
  }

  /** Adds environment variables: a map or `["KEY=VALUE", ...]`. */
  withEnvs(env: Record<string, string> | readonly string[]): this {
    Object.assign(this.env, envOf(env));
    return this;
  }

  withWorkdir(dir: string): this {
    this.workdir = dir;
    return this;
  }

  /** What `image` on create gets (see the module comment). */
  toSpec(): string | ImageSpec | undefined {
    const spec: ImageSpec = {};
    if (this.base !== undefined) spec.base = this.base;
    if (this.pythonVersion !== undefined) spec.python_version = this.pythonVersion.replace(/^python/i, "");
    if (this.pythonPackages.length > 0) spec.python_packages = [...this.pythonPackages];
    if (this.systemPackages.length > 0) spec.system_packages = [...this.systemPackages];
    if (this.commands.length > 0) spec.commands = [...this.commands];
    if (Object.keys(this.env).length > 0) spec.env = { ...this.env };
    if (this.workdir !== undefined) spec.workdir = this.workdir;
    const keys = Object.keys(spec);
    if (keys.length === 0) return undefined;
    if (keys.length === 1 && spec.base !== undefined) return spec.base;
    return spec;
  }

  toJSON(): string | ImageSpec | null {
    return this.toSpec() ?? null;
  }
}

/** `image` of the create body for an option value. */
export function imageField(image: string | Image | undefined): string | ImageSpec | undefined {
  if (image === undefined) return undefined;
  if (typeof image === "string") return image;
  return image.toSpec();
}
