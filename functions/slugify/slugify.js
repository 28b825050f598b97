// Turn a title into a URL slug: lower case, ASCII letters and digits joined by dashes.
function handler(input) {
  const max = input.max_length || 80;
  const slug = input.title
    .normalize("NFKD")
    .replace(/[\u0300-\u036f]/g, "")
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, "-")
    .replace(/^-+|-+$/g, "")
    .slice(0, max)
    .replace(/-+$/, "");
  console.log("slug of", JSON.stringify(input.title)); // goes to the logs
  return { slug: slug };
}
