// Bun imports .sql files as text (`with { type: "text" }`), which embeds the
// migrations in the compiled binary.
declare module "*.sql" {
  const text: string;
  export default text;
}
